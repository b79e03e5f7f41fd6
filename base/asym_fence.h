// Asymmetric fences between processes (membarrier(2), GLOBAL_EXPEDITED):
// the fast side of a Dekker-style handshake (a writer that stores a count,
// then looks at a "wake me" flag) skips its full fence, and the slow side
// (a reader that stores the flag, then looks at the count once more before
// it sleeps) pays for both with HeavyFence(), which makes every CPU running
// a thread of a process that called Ready() execute a full barrier: the
// writer's count is then visible, or its look at the flag comes after the
// barrier and sees the flag. The writer may skip its fence only if the
// reader promised to call HeavyFence before every such sleep, and only if
// the writer's own process is Ready() (registered: the barrier reaches it).
#pragma once

namespace vsocket {

// True if this process can take part (the kernel offers
// MEMBARRIER_CMD_GLOBAL_EXPEDITED and this process registered for it; done
// once per process, again in a forked child). VSOCKET_ASYM_FENCE=0: never.
bool AsymFenceReady();

// The slow side's fence: membarrier(GLOBAL_EXPEDITED) if AsymFenceReady(),
// else a full fence of this thread only.
void HeavyFence();

// The fast side's: a compiler barrier (the hardware may reorder the
// store before it with the load after it; HeavyFence makes that harmless).
inline void LightFence() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

}  // namespace vsocket
