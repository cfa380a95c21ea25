"""n gevent greenlets parked in a few distinct places, for the introspection
and HTML benchmarks (the same program, so their figures compare)."""
import gevent
import gevent.event
import gevent.queue


def park(n, shapes=("deep", "queue", "sleep", "callback")):
    """Spawn n greenlets spread over the named shapes and let them park;
    returns (greenlets, release) with release() ending them all."""
    gate, queue = gevent.event.Event(), gevent.queue.Queue()

    def deep(levels):
        return deep(levels - 1) if levels else gate.wait()

    def in_callback():
        return sorted([2, 1], key=lambda item: gate.wait() and item)

    every = {"deep": lambda: deep(5), "queue": queue.get, "sleep": lambda: gevent.sleep(3600),
             "callback": in_callback}
    kinds = [every[name] for name in shapes]
    greenlets = [gevent.spawn(kinds[i % len(kinds)]) for i in range(n)]
    gevent.sleep(0)
    gevent.sleep(0)

    def release():
        gate.set()
        gevent.killall(greenlets)

    return greenlets, release
