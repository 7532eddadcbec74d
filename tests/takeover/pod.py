"""A pod's servers for the takeover runs: one process, no fork per client (busybox httpd and socat
fork, which under the lab's emulation is slower than the traffic asks). Standard library only;
run inside the pod's network namespace:

    python3 tests/takeover/pod.py NAME

TCP 7000: every line a client sends comes back as "NAME LINE" (a long-lived connection sends a
line every 100 ms). UDP 7001: every datagram comes back as "NAME DATAGRAM".
"""

from __future__ import annotations

import asyncio
import sys

TCP_PORT = 7000
UDP_PORT = 7001


async def main(name: str) -> None:
    prefix = f"{name} ".encode()

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                writer.write(prefix + line)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    class Udp(asyncio.DatagramProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
            self.transport.sendto(prefix + data, addr)  # type: ignore[attr-defined]

    server = await asyncio.start_server(client, "0.0.0.0", TCP_PORT, backlog=1024)
    loop = asyncio.get_running_loop()
    await loop.create_datagram_endpoint(Udp, local_addr=("0.0.0.0", UDP_PORT))
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
