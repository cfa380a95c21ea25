"""asyncio tasks parked for the dump benchmarks (benchmarks/bench_asyncio.py):
in its own process too, so that a target imports neither btcore nor greenlet."""
import asyncio


async def _sleeper():
    await asyncio.sleep(3600)


async def _awaits(task):
    await task


async def _gathers():
    await asyncio.gather(_sleeper(), _sleeper())


async def _locked(lock):
    async with lock:
        pass


async def _queued(queue):
    await queue.get()


async def park(count):
    """Park count tasks (and gather's children) in asyncio.sleep() through four await chains."""
    lock, queue = asyncio.Lock(), asyncio.Queue()
    await lock.acquire()
    made = []
    while len(made) < count:
        inner = asyncio.create_task(_sleeper())
        made += [inner, asyncio.create_task(_awaits(inner)), asyncio.create_task(_gathers()),
                 asyncio.create_task(_locked(lock)), asyncio.create_task(_queued(queue))]
    for _ in range(3):
        await asyncio.sleep(0)
    return made
