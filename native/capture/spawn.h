/* spawn.c's chains as spawn_notes.c reads them (with the GIL held).  The
 * crash handler's reader, which holds no GIL, is spawn_crash.h. */
#ifndef BTC_SPAWN_H
#define BTC_SPAWN_H

#include <Python.h>

/* The key under which the rendered note of g's spawn chain is kept:
 * (cut, site, spawner repr, site, spawner repr, ...) newest generation
 * first, over the generations _spawn_chain(g, btc_spawn_generations())
 * reads, cut telling older ones exist.  A chain that fails again, from any
 * of the greenlets it made, has an equal key: sites are interned and a
 * spawner's repr is taken once.  A new reference; None if g is untracked
 * (or no greenlet or task); NULL with an exception set if memory ran out. */
PyObject *btc_spawn_chain_key(PyObject *g);

#endif
