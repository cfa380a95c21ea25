"""What collect() captures and what it captures of: backtraces, raw records, frames, greenlet and
thread state, spawn tracking, asyncio tasks, snapshot() (native/capture/)."""
