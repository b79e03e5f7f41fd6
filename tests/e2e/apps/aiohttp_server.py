#!/usr/bin/python3
"""aiohttp_server.py ADDR PORT DIR: an asyncio (aiohttp.web) server answering
GET /NAME with the file DIR/NAME (read once at start), keep-alive as the
client asks. Prints "listening" once it listens; SIGTERM/SIGINT stop it
cleanly (the loop ends, the interpreter exits: the library's exit handlers
write its report's exit lines)."""
import asyncio
import os
import signal
import sys

from aiohttp import web

addr, port, d = sys.argv[1], int(sys.argv[2]), sys.argv[3]
files = {"/" + n: open(os.path.join(d, n), "rb").read() for n in os.listdir(d)}
served = 0


async def handle(request):
    global served
    body = files.get(request.path)
    if body is None:
        return web.Response(status=404)
    served += 1
    return web.Response(body=body, content_type="application/octet-stream")


async def main():
    app = web.Application()
    app.router.add_get("/{name}", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, addr, port, backlog=256)
    await site.start()
    print("listening", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    await stop.wait()
    await runner.cleanup()
    print(f"stopped: {served} responses served", flush=True)


asyncio.run(main())
