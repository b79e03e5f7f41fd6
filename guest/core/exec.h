// exec(): the connections the new program inherits. The library cannot
// follow a connection into another image (it starts with none of our
// tables, and without us at all if its environment does not preload us), so
// each one is named in the log and the report before the exec: kernel TCP
// from then on (reason inherited). One this process had accelerated cannot
// go on at all: its bytes are in rings that end with this image's session,
// so it is reset (ECONNRESET on both ends), never left to a silently short
// stream.
#pragma once

namespace vsocket::guest {

// Before exec of `program` with environment envp (the new image's).
void BeforeExec(const char* program, char* const envp[]);

}  // namespace vsocket::guest
