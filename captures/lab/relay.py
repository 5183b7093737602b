"""A TCP relay that holds every chunk it forwards for a fixed delay, for connections from chosen client addresses:
a slow network path for one client, made without netem (this kernel has none).

    python3 relay.py --listen IP:PORT --connect IP:PORT --source IP --delay-ms 20 --slow IP [--slow IP]...

Each direction of a slow connection is a queue: a chunk read at t is written at t + delay, in order, so each leg of
each exchange takes `delay` longer (an exchange ≈ 2 × delay). Other clients pass through at once. The relay ends
each TCP connection as its peer does (half-close passed on)."""

from __future__ import annotations

import argparse
import asyncio


def endpoint(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def feed() -> None:
        while True:
            try:
                data = await reader.read(65536)
            except (ConnectionError, OSError):
                data = b""
            await queue.put((loop.time() + delay_s, data))
            if not data:
                return

    async def drain() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
            except (ConnectionError, OSError):
                return

    await asyncio.gather(feed(), drain())


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--connect", required=True)
    parser.add_argument("--source", default=None)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--slow", action="append", default=[])
    args = parser.parse_args()
    target, listen = endpoint(args.connect), endpoint(args.listen)
    delay_s = args.delay_ms / 1000

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        peer = client_w.get_extra_info("peername")[0]
        delay = delay_s if peer in args.slow else 0.0
        try:
            server_r, server_w = await asyncio.open_connection(
                *target, local_addr=(args.source, 0) if args.source else None)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, server_w, delay), pipe(server_r, client_w, delay))
        for w in (server_w, client_w):
            w.close()

    server = await asyncio.start_server(handle, *listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
