"""Starts an amqtt broker on a loopback port for bench/mqtt_bench.py; run it with the python of
the venv that bench/brokers.py installs amqtt into.

    amqtt-venv/bin/python amqtt_broker.py PORT

Only the authentication plugin, accepting any client that sends a user name (the bench's clients
all do): amqtt queues no messages for an anonymous client's persistent session. No $SYS plugin,
no packet or event logging plugins.
"""

import asyncio
import logging
import signal
import sys

from amqtt.broker import Broker


async def serve(port: int) -> None:
    config = {
        "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}"}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": False}},
    }
    broker = Broker(config)
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"amqtt listening on 127.0.0.1:{port}", flush=True)
    await stop.wait()
    await broker.shutdown()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(serve(int(sys.argv[1])))
