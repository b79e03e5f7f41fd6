-- wrk script: every response must be a 200 whose body equals the file named
-- by the first script argument (`wrk ... -s wrk_body.lua URL -- FILE`).
-- done() prints "bodies: N ok, M bad" (over all threads); wrk's own summary
-- counts the requests and socket errors.
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  local f = assert(io.open(args[1], "rb"))
  expected = f:read("*a")
  f:close()
  ok, bad = 0, 0
end

function response(status, headers, body)
  if status == 200 and body == expected then
    ok = ok + 1
  else
    bad = bad + 1
  end
end

function done(summary, latency, requests)
  local o, b = 0, 0
  for _, t in ipairs(threads) do
    o = o + t:get("ok")
    b = b + t:get("bad")
  end
  io.write(string.format("bodies: %d ok, %d bad\n", o, b))
end
