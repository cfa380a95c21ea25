#!/usr/bin/env python3
"""Mutation smoke test: does the suite catch what it claims to catch?

Each entry of MUTATIONS is a one-line change of the product (native/ or
src/btcore/) that a test is meant to catch.  For each one: copy the
checkout to a scratch directory, apply the change, build and install the
mutant into a scratch target directory (put first on PYTHONPATH, so the
environment running this script is never modified), then run the test
named as its killer, and if that passes, the whole suite (pytest -x).
A mutant of a file installed as it is (a module of src/btcore/) is not
built: it replaces that file in the installed baseline, for its run only.
A mutant of the core (native/) is compiled alone, without pip's wheel
around it, and replaces the baseline's extension for its run only.  The
mutants are shared out among --jobs workers (one per CPU by default), each
with its own copy, target and baseline, since each mutant leaves its
worker's baseline as it found it.  The baseline and the
mutants are built without link-time optimisation (BTCORE_LTO=0) through
ccache (installed with apt-get when missing and possible), in a cache of
this run's own: only the mutated unit compiles again (~2.6 s a mutant, not
~25 s; ~200 of them).  Tests of the behaviour a mutant changes do not
depend on inlining.  A failing run = killed.

Exit status 1 if any mutation survives, if its original text is not found
exactly once (so the list cannot rot silently when the code changes), or if
a mutant does not build.  Run it with the interpreter of an environment that
has btcore's test dependencies and `wheel` (or setuptools >= 70.1):

    python tests/mutations/run.py [--only SUBSTRING] [--timeout SECONDS] [--jobs N]

Adding a mutation is one entry below: the file, its exact original text
(unique in that file), the replacement, the test that should kill it, and
what the mutation breaks.
"""
import argparse
import concurrent.futures
import glob
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Mutation(NamedTuple):
    path: str
    original: str
    replacement: str
    killer: str
    breaks: str
    note: str = ""
    since: tuple = (3, 11)   # the CPython version from which the mutated code runs (run it there: the sid chroot)


MUTATIONS = [
    Mutation("src/btcore/remote/process.py", '        self.state = "running" if stack.kind == "thread" else "suspended"',
             '        self.state = "suspended"',
             "tests/test_process_dump.py::test_outside_text_equals_dump_all_inside",
             "an outside dump shows a thread's running stack as a suspended greenlet, which dump_all() never does"),
    Mutation("src/btcore/views/schema.py", "    return g.address if type(g) is RemoteGreenlet else id(g)",
             "    return id(g)",
             "tests/test_process_dump.py::test_live_dump_shows_every_greenlet_as_the_process_itself_does",
             "an outside dump's JSON names its greenlets by objects of the dumper, not by their addresses in the target"),
    Mutation("native/remote/rmodules.c", "                nat[i].eval = at >= t->eval_lo[k] && at < t->eval_hi[k];",
             "                nat[i].eval = false;",
             "tests/test_process_dump.py::test_live_dump_shows_every_greenlet_as_the_process_itself_does",
             "no frame of an outside dump is the target's eval loop: the one merge puts no Python frame in its place"),
    Mutation("native/remote/rmodules.c", "    btc_merge_input in = {.nat = nat, .n = n, .complete = n < BTC_REMOTE_MAX_NATIVE, .greenlet = st->greenlet,",
             "    btc_merge_input in = {.nat = nat, .n = n, .complete = n < BTC_REMOTE_MAX_NATIVE, .greenlet = false,",
             "tests/test_process_dump.py::test_live_dump_shows_every_greenlet_as_the_process_itself_does",
             "an outside dump's greenlets keep greenlet's switching frames, which collect() hides"),
    Mutation("native/remote/rpython.c", "&flag, 1) && flag;", "&flag, 1) && flag == 1;",
             "tests/test_process_dump.py::test_a_frame_read_while_it_changes_gives_an_entry_flag_not_garbage",
             "3.11's is_entry byte is believed only when it holds 1: a frame read while it changes, holding any "
             "other true value, is taken for no entry"),
    Mutation("native/remote/pylayout.c", "#define PY314 0x030E, 24, 96, 72, 3", "#define PY314 0x030E, 24, 96, 64, 3",
             "tests/test_process_dump.py::test_entry_frames_of_a_target_on_another_cpython_split_the_merge[3.14]",
             "the layout table puts greenlet's saved link of a 3.14 frame object 8 bytes early: a suspended "
             "greenlet's entry frames are lost, its Python frames merged into one eval-loop frame",
             "built for 3.14 the static assertions refuse it; built for 3.11 it dies in the named test"),
    Mutation("src/btcore/remote/debug_offsets.py",
             '"size previous executable instr_ptr localsplus owner stackpointer tlbc_index"',
             '"size executable previous instr_ptr localsplus owner stackpointer tlbc_index"',
             "tests/test_process_dump.py::test_a_target_on_another_cpython_is_read_through_its_debug_offsets[3.14]",
             "3.14's _Py_DebugOffsets are read in the wrong field order: a frame's link taken for its code",
             "on a 3.14+ build test_pylayout.py's comparison with the compiled offsets kills it too"),
    Mutation("src/btcore/remote/debug_offsets.py", '    lay.interp_gc_generations += o["interpreter_state.gc"]', "",
             "tests/test_process_dump.py::test_greenlets_of_a_target_on_another_cpython_are_listed[3.14]",
             "a 3.13+ target's gc lists are looked for at the start of the interpreter: no greenlet is found"),
    Mutation("native/remote/rpython.c", "return exposed && saved_link_ends_call(v, L, f, prev);", "return false;",
             "tests/test_process_dump.py::test_entry_frames_of_a_target_on_another_cpython_split_the_merge[3.13]",
             "the links greenlet saved when it exposed a suspended greenlet's frames are not followed: on 3.12+ "
             "its entry frames are lost"),
    Mutation("native/remote/rpython.c", "        v.nspill = (size_t)g->saved;", "        v.nspill = 0;",
             "tests/test_process_dump.py::test_entry_frames_of_a_target_on_another_cpython_split_the_merge[3.15]",
             "a suspended greenlet's shims are read where its stack lay, not from greenlet's heap copy of it: "
             "another greenlet's bytes decide its entry frames"),
    Mutation("native/remote/rpython.c", "        if (is_shim(L, owner)) {\n            if (n > 0)\n                out[n - 1].entry = 1;\n",
             "        if (is_shim(L, owner)) {\n",
             "tests/test_process_dump.py::test_entry_frames_of_a_target_on_another_cpython_split_the_merge[3.14]",
             "a shim frame does not mark the frame it called as its eval-loop call's entry: a 3.12+ thread's "
             "Python frames are merged into one eval-loop frame"),
    Mutation("native/remote/rpython.c", "(intptr_t)(instr - code - L->code_adaptive)", "(intptr_t)(instr - code)",
             "tests/test_pylayout.py::test_a_threads_frames_are_cpythons",
             "instruction offsets ignore where a code object's bytecode starts: every remote frame gets a wrong line"),
    Mutation("src/btcore/remote/greenlet_offsets.py", "    return mains > 0\n", "    return True\n",
             "tests/test_greenlet_offsets.py::test_learned_from_greenlet_objects_equal_the_in_process_offsets",
             "StackState is placed where no main greenlet marks it: a guess among plausible-looking words"),
    Mutation("src/btcore/remote/greenlet_offsets.py", "    if memory.word(greenlet_type + _TP_BASICSIZE) != _GREENLET_BASICSIZE:",
             "    if False:",
             "tests/test_greenlet_offsets.py::test_garbage_objects_are_refused",
             "objects of any type are taken for greenlets: offsets learned from what is not greenlet's layout"),
    Mutation("src/btcore/remote/bounds.py", "    return -2 <= lasti < 2 * code.units and not lasti & 1",
             "    return True",
             "tests/test_hostile_dump.py::test_a_huge_instruction_offset_is_refused_not_allocated",
             "a corrupt frame's instruction offset past its code is taken as is: no note, a line from garbage"),
    Mutation("src/btcore/remote/snapshot.py", "        if not bounds.readable(addr, n):", "        if addr <= 0:",
             "tests/test_hostile_dump.py::test_reads_past_the_address_space_or_the_size_bound_are_refused",
             "an address read from a corrupt target past 2**64 reaches cffi: OverflowError, exit 1, no dump at all",
             "the corpus's f_code = 2**64-16 no longer reaches it: the code-type check reads ob_type first"),
    Mutation("native/remote/rpython.c", "        if (f && loops(&watch, f))", "        if (0)",
             "tests/test_hostile_dump.py::test_a_self_linked_frame_chain_is_cut_with_a_note",
             "a frame chain that loops is walked to the frame bound: thousands of copies of one frame, no note"),
    Mutation("native/remote/rpython.c", "if ((at & 7) || loops(&watch, at) || is_head(", "if ((at & 7) || is_head(",
             "tests/test_hostile_dump.py::test_corrupt_thread_states_and_gc_lists_leave_a_dump[self]",
             "a gc list that loops (a self-linked object) is walked 50 million times and not noted"),
    Mutation("src/btcore/remote/spawn.py", "    if not 1 <= export.capacity <= MAX_CAPACITY:", "    if False:",
             "tests/test_hostile_dump.py::test_a_spawn_export_claiming_a_capacity_out_of_bounds_is_refused_with_a_note",
             "a corrupt target's spawn export joins its chains to whatever capacity it claims (0: empty sites), "
             "with no note"),
    Mutation("native/remote/rpython.c", "(g->copy & 7) || copy_overlaps(g, pimpl, pimpl + pimpl_read) ||",
             "(g->copy & 7) ||",
             "tests/test_hostile_dump.py::test_a_heap_copy_over_its_own_state_or_missing_is_noted_as_inconsistent[self]",
             "a greenlet whose heap copy points at its own state is walked over that state's bytes, shown as "
             "whatever they decode to (at times with no note: CI's ASan lane, stop 36)"),
    Mutation("native/capture/greenlet_state.h", "&&\n           (saved == 0) == (copy == 0);", ";",
             "tests/test_hostile_dump.py::test_a_heap_copy_over_its_own_state_or_missing_is_noted_as_inconsistent[0]",
             "a greenlet with a saved part but no heap copy is listed as suspended with its stack read from address 0"),
    Mutation("native/remote/rpython.c", "end < g->start || end > hi[last] ||", "end < g->start ||",
             "tests/test_hostile_dump.py::test_saved_stacks_are_copied_only_on_one_stack_and_within_the_budget",
             "a corrupt greenlet's saved stack is copied at whatever size it claims, off any stack of the target"),
    Mutation("src/btcore/remote/snapshot.py",
             "        [heads[0]] + [head for head, then, now in zip(heads[1:], known.lists, lists) if then != now]",
             "        [heads[0]]",
             "tests/test_remote_stop.py::test_a_greenlet_made_between_two_stops_is_listed_wherever_it_went",
             "a stop walks the youngest gc list only, even after a collection or gc.freeze() moved a new greenlet "
             "out of it: that greenlet is missing from the dump"),
    Mutation("src/btcore/remote/snapshot.py", "        parts = [self.memory.read(head, size) for head in heads[1:]]",
             "        parts = [self.memory.read(head, size) for head in heads[1:-1]]",
             "tests/test_remote_stop.py::test_a_greenlet_made_between_two_stops_is_listed_wherever_it_went",
             "gc.freeze() (a new tail of the permanent generation) goes unseen: a greenlet made just before it is "
             "not listed"),
    Mutation("native/remote/rpython.c", "(uint32_t)w[2] && w[3]", "w[3]",
             "tests/test_remote_stop.py::test_a_freed_greenlet_is_not_taken_for_a_live_one",
             "a greenlet freed since the last walk (its block still naming its type) is checked as a live one"),
    Mutation("src/btcore/remote/snapshot.py", "                memory.prefetch(target.gc_chunks)", "                pass",
             "tests/test_remote_stop.py::test_a_greenlet_made_between_two_stops_is_listed_wherever_it_went",
             "a stop that must walk every gc list (a collection since the last walk) reads their pages one syscall "
             "each: hundreds of syscalls in the window"),
    Mutation("src/btcore/profile/remote.py", "                self._room.recopy.add(g.address)", "                pass",
             "tests/test_remote_stop.py::test_a_profilers_stop_reuses_unchanged_copies_and_never_shows_a_stale_one",
             "a greenlet that ran and parked again with the same state keeps the stale copy: left out of every "
             "sample from then on"),
    Mutation("native/remote/rpython.c", "            g->copied = BTC_REMOTE_COPIED_BEFORE;", "            g->copied = 1;",
             "tests/test_remote_stop.py::test_a_profilers_stop_reuses_unchanged_copies_and_never_shows_a_stale_one",
             "a saved stack taken from the previous sample's copy is not marked so: a greenlet that ran and parked "
             "again with the same state is shown with its old stack under its new Python frames"),
    Mutation("src/btcore/remote/bounds.py", "        if at > n:\n            return False", "        pass",
             "tests/test_hostile_dump.py::test_line_tables_whose_last_entry_runs_past_their_end_are_refused",
             "a line table whose last entry runs past its end reaches CPython's co_lines, which reads past it"),
    Mutation("src/btcore/remote/bounds.py", "        if not obj or not self._is(obj, self._types.str):", "        if not obj:",
             "tests/test_hostile_dump.py::test_a_name_or_line_table_pointer_to_another_object_is_refused",
             "a name pointer to another object (the code itself) is read as a str: its words taken for a length "
             "and flags, garbage shown as a name with no note"),
    Mutation("src/btcore/remote/bounds.py", "        if self.left <= 0:", "        if False:",
             "tests/test_hostile_dump.py::test_code_objects_are_read_within_their_bounds_and_the_dumps_budget",
             "names and line tables are read past the dump's budget: a target of many codes with maximal names "
             "grows the dumper without bound"),
    Mutation("native/remote/rpython.c", "return g->frame || g->saved > 0;", "return g->frame != 0;",
             "tests/test_process_dump.py::test_live_dump_shows_every_greenlet_as_the_process_itself_does",
             "a greenlet parked in Cython code (no Python frame) is taken for a running one and not dumped"),
    Mutation("src/btcore/remote/snapshot.py", "            memory.prefetch(chunks)\n", "",
             "tests/test_process_dump.py::test_the_stop_reads_the_target_in_a_few_syscalls",
             "the stop does not re-read the rehearsal's chunks in batches: it reads the gc lists chunk by chunk "
             "while the target is stopped"),
    Mutation("src/btcore/remote/snapshot.py",
             "        remote_tasks.learn(target)   # before the gathering", "        (lambda target: None)(target)   #", "tests/test_remote_stop.py::test_the_stop_reads_again_what_the_rehearsal_gathered_not_what_learning_"
             "the_target_walked",
             "the stop reads again every chunk of the heap that learning the target's asyncio tasks walked (3.14, one "
             "greenlet: 1,441 chunks instead of 299, the stop 1.3 ms instead of 0.6)"),
    Mutation("native/watch/report.c", "    static line_table table;\n    add_python(t, f, btc_read_own, &table);",
             "    line_table table;\n    add_python(t, f, btc_read_own, &table);",
             "tests/test_crash.py::test_the_report_fits_on_faulthandler_s_alternate_stack",
             "the crash report copies a 16 KB line table onto faulthandler's 16 KB alternate stack, past its bottom "
             "into the heap (a parked greenlet's saved stack)"),
    Mutation("native/remote/rmem.c", "        btc_rmem_prefetch(m, under, 2 * n);", "        (void)under;",
             "tests/test_remote_memory.py::test_ranges_of_one_size_read_at_once_equal_the_process_memory",
             "learning a target's greenlet layout reads its 4,096 sampled objects chunk by chunk, a syscall each"),
    Mutation("native/remote/rmem.c", "        read(pid, job, lo, hi, &stats);", "        read(pid, job, lo, hi - 1, &stats);",
             "tests/test_remote_memory.py::test_prefetched_pages_equal_the_process_memory_around_holes",
             "the two readers of a shared job leave the last page of each slice unread"),
    Mutation("src/btcore/remote/snapshot.py", "        if callable(handler):   # SIG_DFL", "        if False:   # SIG_DFL",
             "tests/test_process_dump.py::test_ctrl_c_in_the_stopped_window_still_resumes_the_target",
             "Ctrl-C between two detaches raises there: threads of the target stay stopped"),
    Mutation("src/btcore/remote/snapshot.py", 'in (["Z"], ["X"])', "in ()",
             "tests/test_process_dump.py::test_a_target_that_dies_while_stopped_gives_a_partial_dump_and_a_note",
             "a target that died during the dump (a zombie) gets no note"),
    Mutation("src/btcore/web.py", "        if not self._allowed_host(host.group(1)):", "        if False:",
             "tests/test_web.py::test_foreign_host_and_origin_are_refused",
             "serve() answers any Host: a page of another site, its name rebound to 127.0.0.1, reads every stack"),
    Mutation("src/btcore/web.py", "        if origin is not None and not self._allowed_host(_origin_host(origin)):",
             "        if False:",
             "tests/test_web.py::test_foreign_host_and_origin_are_refused",
             "serve() answers requests another site's page makes (a foreign Origin)"),
    Mutation("src/btcore/web.py", "        if self.token is not None and not hmac.compare_digest(",
             "        if False and not hmac.compare_digest(",
             "tests/test_web.py::test_token_is_required",
             "serve()'s token is not checked: anyone who reaches the port reads every stack"),
    Mutation("src/btcore/web.py", "        if len(self._connections) >= self._max_connections:", "        if False:",
             "tests/test_web.py::test_connections_are_capped",
             "serve() takes every connection: idle clients use up the program's descriptors (EMFILE in its own open())"),
    Mutation("src/btcore/web.py", "        if end > MAX_HEAD or (end < 0 and len(head) > MAX_HEAD):", "        if False:",
             "tests/test_web.py::test_huge_heads_are_refused",
             "serve() reads request heads of any size into memory"),
    Mutation("src/btcore/web.py", "        conn.settimeout(left)", "        conn.settimeout(None)",
             "tests/test_web.py::test_idle_and_slow_clients_are_cut_off",
             "an idle client holds its connection (and a thread or greenlet of serve()) for as long as it likes"),
    Mutation("src/btcore/web.py", "                job.set(self._offload(_render_bytes, infos, fmt))",
             "                job.set(_render_bytes(infos, fmt))",
             "tests/test_web.py::test_the_loop_ticks_while_the_page_is_rendered",
             "the page is resolved and rendered in the hub: the program's event loop stops for the whole render"),
    Mutation("src/btcore/web.py", "        shared = self._jobs.setdefault(fmt, job)", "        shared = job",
             "tests/test_web.py::test_concurrent_requests_share_one_render",
             "concurrent requests render one page each: ten GETs cost ten renders"),
    Mutation("native/remote/rmodules.c", "        n = btc_jump_parts(&scan, lo, hi, n, max);", "",
             "tests/test_process_dump.py::test_a_target_on_another_cpython_is_read_through_its_debug_offsets",
             "a stripped interpreter's unnamed eval-loop parts are not found: the dump lists its Python frames "
             "after the native stack instead of in place"),
    Mutation("native/remote/rpython.c", "says_entry(v, L, f, prev, exposed)};", "1};",
             "tests/test_process_dump.py::test_live_dump_shows_every_greenlet_as_the_process_itself_does",
             "every remote Python frame is taken for the first of its eval-loop call: the merge misplaces "
             "Python frames that one C frame of the eval loop runs together"),
    Mutation("native/capture/unwind.c", ".signal = signal,", ".signal = 0,",
             "tests/test_symbolize.py::test_signal_frames_are_named_like_gdb",
             "a signal return stub is named at pc - 1 (no name) instead of __restore_rt"),
    Mutation("native/symbols/dwarf.c", "return name || d->debug == d->elf ? name :", "return name ? name : NULL; (void)",
             "tests/test_symbolize.py::test_signal_frames_are_named_like_gdb",
             "a symbol only in the debug file's .symtab is not used"),
    Mutation("native/symbols/demangle.c", "!(counted && !starts_with_digit(body + size + 1));", "true;",
             "tests/test_symbolize.py::test_cython_names_decode_to_the_functions_they_wrap",
             "a Cython def function's counter is read as a path part"),
    Mutation("native/symbols/symbolize.c", "        at->vdso = m->path[0] != '/' && btc_vdso_holds(m->lo, m->hi);",
             "        at->vdso = false;",
             "tests/test_symbolize.py::test_every_vdso_function_is_named_from_its_image",
             "a pc in the vDSO (a sampled clock read) is not named: it has no file to read symbols from"),
    Mutation("native/symbols/vdso.c", "    if (image_fd >= 0 && !still_ours()) {", "    if (0) {",
             "tests/test_symbolize.py::test_the_vdso_copy_is_made_again_when_the_program_closed_it",
             "after a program closed every descriptor, its own file under the copy's number is read as the vDSO"),
    Mutation("native/capture/modules.c", "    if (fd >= 0 && !btc_module_build_is(got,", "    if (0 && !btc_module_build_is(got,",
             "tests/test_symbolize.py::test_a_library_upgraded_on_disk_is_named_from_the_inode_loaded",
             "a library upgraded on disk under the running process: its new build is taken as the module's file "
             "(its eval-loop ranges; the symbolizer's own check then leaves the frames unnamed)"),
    Mutation("native/capture/modules.c", "    int fd = open_if_build(path, id, id_len);",
             "    int fd = path[0] == '/' ? open_if_build(path, id, id_len) : -1;",
             "tests/test_symbolize.py::test_a_library_loaded_by_a_relative_path_is_named",
             "a library dlopen()ed by a relative path (its name as given) is never named"),
    Mutation("native/capture/modules.c", "        fd = open_if_build(mapped, id, id_len);", "        fd = -1;",
             "tests/test_symbolize.py::test_a_library_upgraded_on_disk_is_named_from_the_inode_loaded",
             "a library upgraded on disk is never named, even where the inode loaded can be opened"),
    Mutation("native/symbols/symbolize.c", "    if (c && is_module_build(c, at)) {", "    if (c) {",
             "tests/test_symbolize.py::test_a_library_upgraded_on_disk_is_not_named_without_its_file",
             "the new build at an upgraded library's path, cached by a path lookup (a token's decoding), names its frames"),
    Mutation("native/symbols/elf.c", "            e->refs++;\n            return e;", "            continue;",
             "tests/test_symbolize.py::test_one_symbol_table_per_file",
             "an ELF file already open is read into memory again"),
    Mutation("native/symbols/symbolize.c", "    while (held > byte_budget) {", "    while (held > byte_budget && 0) {",
             "tests/test_symbolize.py::test_decoded_dwarf_stays_within_its_byte_budget",
             "decoded DWARF is never given back: the byte budget does not hold"),
    Mutation("native/symbols/elf.c", "    memcpy(p->window + ZWINDOW - have, out + p->out - have, have);", "",
             "tests/test_symbolize.py::test_compressed_libpython_read_in_parts_matches_addr2line",
             "an access point into a compressed section keeps no window: parts inflate to garbage"),
    # The one ELF reader (issue 26): symbols by name, notes, build-ids, core files.
    Mutation("native/symbols/elf.c", "        if (s.st_shndx != SHN_UNDEF && s.st_name < strings->size &&",
             "        if (s.st_name < strings->size &&",
             "tests/test_elf_reader.py::test_symbol_values_equal_pyelftools_in_a_fixture",
             "an undefined symbol (an import) is taken for the definition: the dump reads the target at its value 0"),
    Mutation("native/symbols/elf.c", "    skip(r, ((uint64_t)n->namesz + 3) & ~3ull);", "    skip(r, n->namesz);",
             "tests/test_elf_reader.py::test_a_small_core_is_read_as_built",
             "a note's name is not padded to 4 bytes: a core's CORE notes are read from the wrong offset"),
    Mutation("native/symbols/elf.c", "    r->p += pad < left ? pad : left;", "",
             "tests/test_elf_reader.py::test_a_small_core_is_read_as_built",
             "a note's description is not padded: the note after one of odd length is misread"),
    Mutation("native/symbols/elf.c", "        if (note.type == NT_GNU_BUILD_ID && btc_elf_note_named(&note, \"GNU\") && note.descsz) {",
             "        if (btc_elf_note_named(&note, \"GNU\") && note.descsz) {",
             "tests/test_elf_reader.py::test_build_ids_equal_pyelftools",
             "another GNU note (.note.gnu.property, the ABI tag) is taken for the build-id"),
    Mutation("native/symbols/elf_core.c", "        t->regs[1] = word(regs + 19 * 8);", "        t->regs[1] = word(regs + 18 * 8);",
             "tests/test_elf_reader.py::test_core_registers_are_the_threads_own",
             "a core thread's sp is read from the next register (eflags): its stack is walked from nowhere"),
    Mutation("native/symbols/elf_core.c", "        if (word(n->desc + at) == AT_SYSINFO_EHDR)", "        if (1)",
             "tests/test_elf_reader.py::test_a_small_core_is_read_as_built",
             "the vDSO's address is any auxv entry's value: a thread stopped in clock_gettime is not walked"),
    Mutation("src/btcore/remote/snapshot.py", "    return [Mapping(vdso.lo, vdso.hi, vdso.perms, 0, path)] if path else []",
             "    return []",
             "tests/test_process_dump.py::test_a_thread_inside_the_vdso_is_named_from_its_symbols",
             "the target's vDSO is no module of the dump: a thread inside clock_gettime is neither walked nor named"),
    Mutation("src/btcore/remote/snapshot.py", "                atexit.register(self._remove, os.getpid())", "                pass",
             "tests/test_process_dump.py::test_a_thread_inside_the_vdso_is_named_from_its_symbols",
             "the vDSO's file is left in the temporary directory after every dumper process"),
    Mutation("native/capture/signal_capture.c", "#define MAX_TABLE_ASKS 64", "#define MAX_TABLE_ASKS 4",
             "tests/test_watchdog.py::test_the_first_report_of_a_stack_through_many_new_modules_is_whole",
             "a sample gives up after a few table builds: the first report of a stack through new modules is cut"),
    Mutation("native/symbols/elf_core.c", "{lo, hi, pages * page, (uint32_t)c->paths_used}", "{lo, hi, pages, (uint32_t)c->paths_used}",
             "tests/test_crash_matrix.py::test_crash",
             "NT_FILE's offsets are taken as bytes, not pages: a core's libraries are placed at the wrong bias"),
    Mutation("native/symbols/elf_core.c", "    if (eh.e_type != ET_CORE || eh.e_machine != EM_X86_64)",
             "    if (eh.e_machine != EM_X86_64)",
             "tests/test_elf_reader.py::test_core_read_refuses_what_is_not_a_core",
             "a shared library given as a core is read as one (no threads, no mappings) instead of refused"),
    Mutation("native/symbols/elf_core.c", "c->nthreads <= c->max_threads && ", "",
             "tests/test_elf_reader.py::test_core_read_asks_for_room_it_needs",
             "a core with more threads than the room given says it was read whole: threads are lost"),
    Mutation("src/btcore/remote/process.py", "        segments, threads, files, paths = c.nsegments, c.nthreads, c.nfiles, c.paths_used",
             "        pass",
             "tests/test_elf_reader.py::test_the_dump_reads_a_core_that_needs_more_room_than_its_first_guess",
             "a core with more mappings or threads than the first guess cannot be dumped"),
    Mutation("native/symbols/elf.c", "        count = first.sh_info;", "        count = eh->e_phnum;",
             "tests/test_elf_reader.py::test_a_small_core_is_read_as_built[PN_XNUM]",
             "a core of 65 535 or more mappings is read as 65 535 program headers (PN_XNUM taken for the count)"),
    Mutation("native/capture/collect_builtin.c", "    if (python_impl_torn_down()) {", "    if (0) {",
             "tests/test_backtrace_api.py::test_collect_during_interpreter_shutdown_is_a_backtrace_or_backtrace_error",
             "collect() at module teardown fails with TypeError"),
    Mutation("native/capture/context.h", "addr > m->hi - 8", "addr > m->hi",
             "tests/test_contracts.py::test_stack_view_reads_exactly_lo_to_hi",
             "the stack view reads one word past its end"),
    Mutation("native/capture/context.h", "BTC_UNLIKELY(addr & 7) || ", "",
             "tests/test_contracts.py::test_stack_view_reads_exactly_lo_to_hi",
             "the stack view reads misaligned words"),
    Mutation("native/capture/context.h", "addr < m->lo ||", "addr < m->lo - 8 ||",
             "tests/test_contracts.py::test_stack_view_reads_exactly_lo_to_hi",
             "the stack view reads one word below its start"),
    Mutation("native/capture/unwind.c", "if (cfa < m->lo || cfa > m->hi)", "if (cfa < m->lo || cfa > m->hi + 8)",
             "tests/test_contracts.py::test_walker_refuses_a_frame_past_the_views_end",
             "a frame address 8 bytes past the view's end is accepted"),
    Mutation("native/capture/cfi_build.c", ".flags = f->cie.signal ? BTC_ROW_SIGNAL : 0", ".flags = 0",
             "tests/test_cfi_tables.py::test_rows_equal_pyelftools",
             "rows lose the signal-trampoline flag (CIE augmentation S), so the frame a signal "
             "interrupted is not taken at its exact pc",
             "aarch64's own mutation (no PAC stripping) is killed only under qemu's max CPU: "
             "tests/test_arch.py in ci/arm64.sh, verified by hand (docs/platforms.md)"),
    Mutation("native/capture/unwind.c", "cfa <= g->hi && cfa >= r->sp + p->span ? cfa : 0;", "cfa <= g->hi ? cfa : 0;",
             "tests/test_cfi_tables.py::test_plain_rows_step_as_the_interpreter",
             "a frame whose fp lies below sp is stepped plain: its slots are read below the region the view checked"),
    Mutation("native/capture/unwind.c", "r->fp < g->hi && !(r->fp & 7) && cfa <= g->hi", "r->fp < g->hi && cfa <= g->hi",
             "tests/test_cfi_tables.py::test_plain_rows_step_as_the_interpreter",
             "a misaligned fp is stepped plain: words read across two slots, where step() reads nothing"),
    Mutation("native/capture/unwind.c", "!(r->fp & 7) && cfa <= g->hi && cfa >= r->sp", "!(r->fp & 7) && cfa >= r->sp",
             "tests/test_cfi_tables.py::test_plain_rows_step_as_the_interpreter",
             "a frame from an fp just below the view's end is stepped plain: its CFA and return address past it"),
    Mutation("native/capture/unwind.c", "(uint64_t)row->cfa_off | (from_fp ? PLAIN_FROM_FP : 0);",
             "(uint64_t)row->cfa_off;", "tests/test_cfi_tables.py::test_plain_rows_step_as_the_interpreter",
             "a row whose CFA is fp + K is stepped as sp + K: every frame-pointer frame's caller is wrong"),
    Mutation("native/capture/unwind.c", "    if (-off > *span)", "    if (0)", "tests/test_cfi_tables.py::test_plain_rows_step_as_the_interpreter",
             "the registers a frame-pointer function saved below fp are read below sp, outside the region checked"),
    Mutation("native/capture/unwind.c", "        set[1] = set[0];\n", "",
             "tests/test_modules.py::test_the_row_cache_keeps_two_call_sites_that_share_a_set",
             "the row cache is direct-mapped again: two call sites of one stack in one set miss at every walk"),
    Mutation("native/capture/unwind.c", "    return set[0].pc == pc ? &set[0] : &set[1];", "    return &set[0];",
             "tests/test_modules.py::test_the_row_cache_keeps_two_call_sites_that_share_a_set",
             "the row cache's second way is never looked in: what a miss moved there is lost"),
    Mutation("native/capture/unwind.c", "    row_cache_clear();\n    row_cache_generation", "    row_cache_generation",
             "tests/test_modules.py",
             "the walker's row cache is not emptied when the module list changes"),
    Mutation("src/btcore/symbols/resolve.py", "        while len(frames) > keep:", "        while False:",
             "tests/test_contracts.py::test_frame_cache_stays_within_its_bound",
             "the frame cache never evicts (unbounded)"),
    Mutation("src/btcore/symbols/resolve.py", "pin=code)", "pin=None)",
             "tests/test_contracts.py::test_cached_python_entry_keeps_its_code_object_alive",
             "cached Python entries do not pin their code object"),
    Mutation("src/btcore/views/dump.py", "    elif previous not in (signal.SIG_DFL, signal.SIG_IGN) and not chain:",
             "    elif False:",
             "tests/test_signal_dump.py::test_refuses_to_replace_gunicorns_handler",
             "register_dump_signal silently replaces a handler somebody else installed (gunicorn's SIGUSR1)"),
    Mutation("src/btcore/views/dump.py", "and _installed_from_c(signum)):", "and False):",
             "tests/test_signal_dump.py::test_refuses_a_handler_installed_from_c",
             "a handler installed from C after start-up (faulthandler.register) is replaced without a word"),
    Mutation("src/btcore/views/dump.py", "    if not dumpwriter.submit(partial(_write_dump, out, infos, stack_text, skipped)):",
             "    if True:",
             "tests/test_signal_dump.py::test_the_handler_only_captures_a_real_thread_writes",
             "the whole dump (names, text, write) runs in the handler: the event loop waits for all of it"),
    Mutation("native/symbols/symbolize.c", "        btc_dwarf_lookup(d, vaddrs[i], levels, AHEAD_LEVELS);\n", "",
             "tests/test_symbolize.py::test_reading_ahead_reads_what_the_lookup_then_needs",
             "the naming ahead reads no DWARF unit: an outside dump's native frames are named after its drawing"),
    Mutation("native/symbols/symbolize.c", " && !(stop && __atomic_load_n(stop, __ATOMIC_RELAXED)); i++) {",
             "; i++) {", "tests/test_symbolize.py::test_reading_ahead_reads_what_the_lookup_then_needs",
             "the naming ahead cannot be ended: a dump waits for every distinct pc of a hostile target to be read"),
    Mutation("native/remote/rmodules.c", "    while (f && !same_file(f, &st))\n        f = f->next;\n",
             "    f = NULL;\n",
             "tests/test_process_dump.py::test_a_module_file_is_read_once_across_dumps_and_again_once_it_changed",
             "every dump reads its modules' files and builds their tables again"),
    Mutation("src/btcore/remote/snapshot.py", 'with open(path, errors="replace") as f:', "with open(path) as f:",
             "tests/test_process_dump.py::test_a_target_named_with_bytes_that_are_not_utf8_is_dumped",
             "a target named with bytes that are not UTF-8 fails every dump of it (UnicodeDecodeError)"),
    Mutation("src/btcore/remote/snapshot.py", 'open(f"/proc/{pid}/maps", encoding="utf-8", errors="surrogateescape")',
             'open(f"/proc/{pid}/maps")', "tests/test_process_dump.py::test_a_target_whose_files_are_named_with_bytes_that_are_not_utf8_is_dumped",
             "a target that maps a file named with bytes that are not UTF-8 fails every dump of it"),
    Mutation("src/btcore/remote/snapshot.py", "memory.handle if memory else ffi.NULL, os.fsencode(path),",
             "memory.handle if memory else ffi.NULL, path.encode(),", "tests/test_process_dump.py::test_a_target_whose_files_are_named_with_bytes_that_are_not_utf8_is_dumped",
             "a module named with bytes that are not UTF-8 fails the dump (UnicodeEncodeError)"),
    Mutation("src/btcore/remote/bounds.py", 'return raw.decode(codec, "surrogatepass")', 'return raw.decode(codec, "replace")',
             "tests/test_process_dump.py::test_a_target_whose_files_are_named_with_bytes_that_are_not_utf8_is_dumped", "a Python file name read from outside is not the target's (its undecodable bytes replaced)"),
    Mutation("src/btcore/views/dump.py", "        file.write(text)\n    except UnicodeEncodeError:", "        file.write(text)\n    except ZeroDivisionError:",
             "tests/test_process_dump.py::test_a_target_whose_files_are_named_with_bytes_that_are_not_utf8_is_dumped", "a dump to a strict UTF-8 stream of a path that is not UTF-8 fails (UnicodeEncodeError)"),
    Mutation("src/btcore/symbols/resolve.py", "module, symbol = _path(info.module),", "module, symbol = _text(info.module),", "tests/test_process_dump.py::test_a_target_whose_files_are_named_with_bytes_that_are_not_utf8_is_dumped",
             "a module's path inside is not its file's name (undecodable bytes replaced): the file cannot be opened by it"),
    Mutation("src/btcore/remote/process.py", '        f = os.fdopen(open_regular(core), "rb")', '        f = open(core, "rb")',
             "tests/test_process_dump.py::test_a_core_path_that_is_not_a_core_file_is_a_clear_error",
             "dump --core of a FIFO waits for a writer that never comes"),
    Mutation("src/btcore/web.py", '.encode("utf-8", "backslashreplace")   # see dump.write_text', '.encode("utf-8")',
             "tests/test_web.py::test_a_file_name_with_undecodable_bytes_is_served_escaped",
             "the page's text form fails for a program whose code names a file with bytes that are not UTF-8"),
    Mutation("src/btcore/__main__.py", "        check_output(args.output)\n", "        pass\n",
             "tests/test_cli.py::test_profile_refuses_an_output_it_could_not_write_before_recording",
             "profile -o of a FIFO, a directory or a device records, then fails to write (the FIFO: a hang)"),
    Mutation("src/btcore/output.py", "os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC",
             "os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC",
             "tests/test_cli.py::test_profile_refuses_an_output_it_could_not_write_before_recording",
             "profile -o of a FIFO waits for a reader that never comes"),
    Mutation("src/btcore/profile/formats.py", '        why = f"cannot write {os.fspath(path)}: {e.strerror or e}"\n',
             "        raise\n",
             "tests/test_cli.py::test_profile_whose_output_went_away_writes_the_recording_elsewhere_and_says_where",
             "a profile whose file cannot be written at the end is lost"),
    Mutation("src/btcore/__main__.py", "        return f.readline(_PIECE)", "        return f.readline()",
             "tests/test_cli.py::test_decode_reads_a_line_without_end_in_bounded_pieces_and_keeps_the_bytes",
             "decode of a file without newlines (/dev/zero) grows its memory without bound"),
    Mutation("src/btcore/__main__.py", 'sys.stdin.reconfigure(errors="surrogateescape", newline="")',
             'sys.stdin.reconfigure(errors="strict")',
             "tests/test_cli.py::test_decode_reads_a_line_without_end_in_bounded_pieces_and_keeps_the_bytes",
             "decode of standard input fails on bytes that are not UTF-8 and rewrites CR and CRLF"),
    Mutation("src/btcore/__main__.py",
             '            failed = _say("decode", f"{path}: {_reason(e)}") != 0\n            continue\n',
             "            raise\n",
             "tests/test_cli.py::test_decode_says_which_files_it_cannot_read_and_decodes_the_others",
             "decode ends at the first file it cannot open, with a traceback"),
    Mutation("src/btcore/__main__.py", '    if sys.stdout is None and args.command != "profile":',
             "    if False:", "tests/test_cli.py::test_a_closed_standard_output_is_one_line_and_status_1",
             "a command with its standard output closed ends in an AttributeError traceback"),
    Mutation("src/btcore/__main__.py", "        except OSError:\n            _drop_output()\n",
             "        except ZeroDivisionError:\n            _drop_output()\n",
             "tests/test_cli.py::test_a_full_standard_output_is_one_line_and_status_1",
             "3.14: a full standard output is said, then flushed again at exit: a second error, status 120 (3.11 "
             "drops what a failed flush held)", since=(3, 14)),
    Mutation("src/btcore/__main__.py", "    except BrokenPipeError:", "    except ZeroDivisionError:",
             "tests/test_cli.py::test_a_reader_that_goes_away_ends_the_command_quietly",
             "decode | head -1 ends in a BrokenPipeError traceback"),
    Mutation("src/btcore/remote/process.py", "    if not 0 < timeout <= MAX_TIMEOUT:", "    if timeout < 0:",
             "tests/test_cli.py::test_dump_options_that_cannot_work_are_refused",
             "dump --timeout nan or 1e7 ends in a ValueError or OverflowError traceback"),
    Mutation("src/btcore/remote/snapshot.py", "    if tgid == os.getpid():", "    if False:",
             "tests/test_cli.py::test_dump_of_this_process_a_thread_or_a_zombie_says_what_it_is",
             "a dump of its own process is refused as if it lacked CAP_SYS_PTRACE"),
    Mutation("src/btcore/remote/snapshot.py", "    if status is not None and exited(tgid):", "    if False:",
             "tests/test_cli.py::test_dump_of_this_process_a_thread_or_a_zombie_says_what_it_is",
             "a dump of a zombie says it is not a CPython process"),
    Mutation("src/btcore/remote/process.py", "    if not c.nthreads:", "    if False:",
             "tests/test_elf_reader.py::test_a_cut_core_or_another_elf_file_is_named_for_what_it_is",
             "a core cut before its notes is 'process 0, not a CPython process'"),
    Mutation("src/btcore/profile/remote.py",
             "        weight = max(0, int(((ended - (self._last or ended)) - snap.stopped_for) * 1e6))",
             "        weight = max(0, int((ended - (self._last or ended)) * 1e6))",
             "tests/test_profile_remote.py::test_samples_weigh_the_time_they_stand_for",
             "an outside profile counts each stop twice: as the stop's and as the greenlets' time"),
    Mutation("src/btcore/views/html.py", "    with os.fdopen(open_output(path), \"w\", encoding=\"utf-8\") as f:\n        f.truncate()\n",
             "    with open(path, \"w\", encoding=\"utf-8\") as f:\n",
             "tests/test_api_misuse.py::test_write_html_takes_a_regular_file_path_only",
             "write_html() of a FIFO waits for a reader for ever"),
    Mutation("src/btcore/watch/crash.py", "        fd = os.dup(file.fileno())", "        fd = file.fileno()",
             "tests/test_api_misuse.py::test_the_crash_report_keeps_writing_to_its_file_after_the_caller_closed_it",
             "a crash report whose file the caller closed goes into the next file opened"),
    Mutation("src/btcore/views/dump.py", "    _check_dump_signal(signum)\n", "",
             "tests/test_api_misuse.py::test_a_signal_that_cannot_carry_a_dump_is_refused",
             "a fault's signal is taken for the dump's: a crash becomes a hang"),
    Mutation("native/watch/watchdog.c", "        atomic_store(&watched[i].watched, 0);\n    return 1;",
             "        (void)0;\n    return 1;",
             "tests/test_api_misuse.py::test_a_watchdog_stopped_from_another_thread_stops_watching_the_thread_that_started_it",
             "a watchdog stopped from another thread leaves its thread watched by the next watchdog"),
    Mutation("src/btcore/web.py", "        if os.getpid() != self._pid:\n", "        if False:\n",
             "tests/test_api_misuse.py::test_a_server_stopped_in_a_forked_child_keeps_serving_in_the_parent",
             "a fork child's Server.stop() shuts the parent's listening socket down"),
    Mutation("src/btcore/web.py", "    _check_serve(host, port, allowed_hosts, max_connections, timeout)\n", "",
             "tests/test_api_misuse.py::test_serve_refuses_arguments_that_cannot_work",
             "serve(port=True) binds port 1, a str of hosts is split into letters"),
    Mutation("src/btcore/remote/snapshot.py", "    tracer = _tracer(pid, tid) if tid is not None else None\n",
             "    tracer = None\n",
             "tests/test_process_dump.py::test_a_target_another_tracer_holds_is_refused_naming_that_tracer",
             "a target another tracer holds is refused as if this process lacked CAP_SYS_PTRACE"),
    Mutation("native/remote/rmodules.c", "#define MAX_KEPT 32\n", "#define MAX_KEPT 4096\n",
             "tests/test_process_dump.py::test_kept_module_files_are_bounded_the_longest_unused_dropped_first",
             "a dumper keeps the image and table of every file it ever dumped"),
    Mutation("native/remote/rmodules.c", "(*at)->released < (*oldest)->released", "(*at)->released > (*oldest)->released",
             "tests/test_process_dump.py::test_kept_module_files_are_bounded_the_longest_unused_dropped_first",
             "the files used last are dropped first: a dump of the same program again reads them again"),
    Mutation("native/remote/rmodules.c", "    pthread_atfork(NULL, NULL, forget_in_child);\n", "",
             "tests/test_process_dump.py::test_a_module_file_is_read_once_across_dumps_and_again_once_it_changed",
             "a fork child takes the kept files' lock as the parent left it: held by a thread the child lacks"),
    Mutation("native/remote/rmodules.c", " && f->size == st->st_size &&\n           f->mtime.tv_sec == st->st_mtim.tv_sec && f->mtime.tv_nsec == st->st_mtim.tv_nsec;",
             " && f->size == st->st_size;",
             "tests/test_process_dump.py::test_a_module_file_is_read_once_across_dumps_and_again_once_it_changed",
             "a file rewritten in place (same inode and size) keeps the image and table read before"),
    Mutation("src/btcore/remote/process.py", "        return _Ahead(todo) if todo and len(os.sched_getaffinity(0)) > 1 else None",
             "        return _Ahead(todo) if todo else None",
             "tests/test_process_dump.py::test_native_frames_are_named_ahead_in_a_thread_gone_with_the_dump",
             "a thread started for the naming ahead on one CPU, where it only competes with the dump"),
    Mutation("src/btcore/remote/process.py", "                if (mod.path, identity, mod.bias, pc, exact) not in _FILE_FRAMES:\n",
             "                if True:\n",
             "tests/test_process_dump.py::test_native_frames_are_named_ahead_in_a_thread_gone_with_the_dump",
             "every dump starts a thread to name frames named already"),
    Mutation("src/btcore/capture/threads.py", '        return monkey.get_original("_thread", name)',
             "        return getattr(_thread, name)",
             "tests/test_signal_dump.py::test_the_handler_only_captures_a_real_thread_writes",
             "in a gevent-patched process the writer is a greenlet of the loop it should spare (it blocks it)"),
    Mutation("src/btcore/views/dumpwriter.py", "    jobs.put(job)\n", "    _real_start_new_thread()(job, ())\n",
             "tests/test_signal_dump.py::test_two_signals_two_dumps_whole_and_in_order",
             "each dump written by a thread of its own: out of order, and unregister does not wait for them"),
    Mutation("src/btcore/views/dump.py", "        dumpwriter.stop()   # the last one: its thread goes too", "        pass",
             "tests/test_signal_dump.py::test_two_signals_two_dumps_whole_and_in_order",
             "unregister returns before the dumps already signalled are written"),
    Mutation("src/btcore/views/dumpwriter.py", "os.register_at_fork(after_in_child=_restart_in_child)", "pass",
             "tests/test_signal_dump.py::test_fork_child_gets_its_own_writer",
             "a forked child queues its dumps for a writer thread it does not have: they are never written"),
    Mutation("src/btcore/views/dump.py", "        self.enabled = gc.isenabled()\n        gc.disable()", "        self.enabled = gc.isenabled()",
             "tests/test_signal_dump.py::test_no_collection_during_the_capture_and_gc_state_kept",
             "a collection of the whole heap may run inside the capture: the loop waits for both"),
    Mutation("src/btcore/views/dumpwriter.py", "atexit.register(drain)", "pass",
             "tests/test_signal_dump.py::test_a_dump_signalled_just_before_exit_is_written",
             "a dump signalled just before the process ends is lost with the writer thread"),
    Mutation("src/btcore/views/dumpwriter.py", "jobs.qsize() >= MAX_PENDING", "False",
             "tests/test_signal_dump.py::test_signals_while_the_writer_is_stuck_are_counted_not_queued",
             "signals sent while the writer is stuck on a blocked file queue a snapshot each: memory without bound"),
    Mutation("native/capture/capture.c", " && btc_greenlet_in_calling_thread(g) != 1)", " && 0)",
             "tests/test_greenlets.py::test_greenlet_suspended_in_another_thread",
             "a greenlet running in another thread (no saved frame) is walked as if suspended: its live stack read"),
    Mutation("native/capture/greenlet_context.c", "ctx->last_cfa = main ? 0 : s.stop;", "ctx->last_cfa = 0;",
             "tests/test_greenlets.py",
             "a suspended greenlet's capture runs past its bottom into its parent's frames"),
    Mutation("native/capture/greenlet_context.c", "ctx->mem.spill_hi = s.start + (uintptr_t)s.saved;",
             "ctx->mem.spill_hi = s.start;",
             "tests/test_greenlets.py",
             "a suspended greenlet's heap-saved stack part is read from the (reused) stack instead"),
    Mutation("native/symbols/symbolize.c", "lookup = flags & (BTC_F_EXACT | BTC_F_SIGNAL) ? pc : pc - 1;",
             "lookup = pc;", "tests/test_symbolize.py",
             "return addresses are symbolized at the next instruction, not at the call"),
    # one per feature or defect fix of the second wave
    Mutation("native/capture/modules.c",
             "strcmp(m->path, id->path) == 0 &&\n           m->build_id_len == id->build_id_len && memcmp(m->build_id, id->build_id, n) == 0;",
             "(n | 1);",
             "tests/test_modules.py::test_different_library_at_the_same_address",
             "a library loaded where another was keeps the other's tables and names"),
    Mutation("native/capture/greenlet_context.c", " && off + sizeof(stack_state) <= layout.object_size;", ";",
             "tests/test_greenlets.py::test_layout_scan_stays_inside_greenlet_object",
             "the layout scan reads past greenlet's C++ object"),
    Mutation("native/symbols/demangle.c", "    if (n > (size_t)(s->end - s->p))\n        return v0_fail(s);\n    *text = s->p;",
             "    *text = s->p;",
             "tests/test_elf_garbage.py::test_demangler_reads_nothing_past_the_name",
             "the Rust v0 demangler takes an identifier longer than what is left of the name"),
    Mutation("native/symbols/symbolize.c", "pthread_atfork(NULL, NULL, cache_after_fork_child);", "(void)cache_after_fork_child;",
             "tests/test_fork.py",
             "a fork while another thread decodes DWARF leaves the child's cache lock held"),
    Mutation("native/capture/capture.c", "    if (!active)\n        return 0;", "    if (!PyObject_IsTrue(g))\n        return 0;",
             "tests/test_greenlets.py::test_greenlet_state_is_greenlets_own_never_bool_or_len",
             "a greenlet's state is decided by bool(g), which subclasses (gevent) override"),
    Mutation("native/capture/unwind.c", "        differ |= *(const uintptr_t *)at ^ proof->value[i];", "        (void)at;",
             "tests/test_spawn.py::test_a_site_seen_before_is_not_taken_for_one_whose_c_frames_differ",
             "a spawn site's proof does not read the return addresses its walk read: a site made under one C "
             "frame is taken for one made under another at the same depth"),
    Mutation("native/capture/cpython/py311.c", "        if (check && ((out[n] ^ w0) | (out[n + 1] ^ w1) | (out[n + 2] ^ w2)))",
             "        if (check && (out[n] ^ w0))",
             "tests/test_spawn.py::test_a_site_seen_before_serves_other_greenlets_on_the_same_path_only",
             "a spawn site's proof does not compare the Python frames: a site made under one function is taken "
             "for one made under another at the same place"),
    Mutation("native/capture/spawn.c", "chain_length((PyObject *)spawner, 2 * GENERATIONS) < 2 * GENERATIONS",
             "1", "tests/test_spawn.py::test_ten_thousand_generations_bounded_newest_kept",
             "spawn ancestry grows without bound"),
    Mutation("native/capture/spawn.c", "state[1] <= sp || state[1] < lo || state[1] > hi)", "state[1] <= sp)",
             "tests/test_crash.py::test_the_handler_finds_the_running_greenlet",
             "the crash report's greenlet search does not keep to the crashed thread's stack: with a greenlet running "
             "in another thread too, no greenlet is named"),
    Mutation("native/capture/spawn.c", "state[0] == 0 || state[3] != 0 ||", "state[0] <= 1 || state[3] != 0 ||",
             "tests/test_crash.py::test_the_crashing_greenlet_and_its_spawn_chain",
             "a greenlet that crashes before its first switch out (greenlet's start mark 1) is not found: no chain"),
    Mutation("native/capture/spawn.c", "    for (; n < max_sites && read_node(node, f); node = f[2], n++) {",
             "    for (; n < max_sites && read_node(node, f); node = 0, n++) {",
             "tests/test_crash.py::test_the_crashing_greenlet_and_its_spawn_chain",
             "the crash report shows the crashing greenlet's own site only: older generations are lost"),
    Mutation("native/watch/crash.c", "        record.magic = BTC_CRASH_MAGIC;", "",
             "tests/test_crash.py::test_the_helper_names_the_record_and_encodes_every_stack",
             "the helper never finds the handler's record complete: the crashing thread at the fault is not named"),
    Mutation("src/btcore/remote/process.py", "        text = crash + _render(snap, stacks, core, format, _token_text if tokens else dump.stack_text)",
             "        text = crash + _render(snap, stacks, core, format, dump.stack_text)",
             "tests/test_crash.py::test_the_helper_names_the_record_and_encodes_every_stack",
             "the crash report's dump has no token of its stacks: nothing to decode offline"),
    Mutation("native/watch/report.c", "    uintptr_t pc = f->flags & (BTC_F_EXACT | BTC_F_SIGNAL) ? f->addr : f->addr - 1;\n    const btc_module *m",
             "    uintptr_t pc = f->addr;\n    const btc_module *m",
             "tests/test_crash_matrix.py::test_crash[null_write-main-faulthandler_first]",
             "the crash report prints callers' return addresses, not their call's (gdb's and addr2line's frames)"),
    Mutation("native/watch/crash.c", "    int saved_errno = errno;\n    uintptr_t none = 0;",
             "    int saved_errno = errno;\n    free(malloc(16));\n    uintptr_t none = 0;",
             "tests/test_crash.py::test_the_report_allocates_nothing_after_the_crash",
             "the crash handler allocates: a crash while another thread holds malloc's lock hangs the process"),
    Mutation("native/watch/crash.c", "        run_helper(fd);\n", "",
             "tests/test_crash.py::test_the_helper_shows_every_parked_greenlet_as_cpython_sees_it",
             "a crash report shows the crashing thread only: no other thread, no parked greenlet"),
    Mutation("native/watch/crash.c", "decimal(helper_pid, (uint64_t)getpid());", "decimal(helper_pid, (uint64_t)getppid());",
             "tests/test_crash.py::test_the_helper_is_off_bounded_and_run_for_a_fork_child",
             "a fork child's crash report dumps its parent (the pid written at enable time, not at the crash)"),
    Mutation("native/watch/crash.c", "    kill(child, SIGKILL);\n", "",
             "tests/test_crash.py::test_the_helper_is_off_bounded_and_run_for_a_fork_child",
             "a helper that outlives its timeout is waited for without bound: a hung helper hangs the crash"),
    Mutation("native/watch/crash.c", "    restore_previous();\n    raise(sig);", "    restore_previous();",
             "tests/test_crash.py::test_abort", "crash report: abort()'s signal is not passed on: faulthandler's report is lost"),
    Mutation("native/watch/crash.c", "    btc_modules_build_tables();", "",
             "tests/test_crash.py::test_fault_in_c_reached_from_a_greenlet",
             "crash report: modules loaded before enabling have no unwind table: the walk stops at the crash"),
    Mutation("native/watch/crash.c", "    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;", "    sa.sa_flags = SA_SIGINFO;",
             "tests/test_crash.py::test_stack_overflow_reported_from_the_alternate_stack",
             "crash report: the handler runs on the overflowed stack: no report of a C stack overflow"),
    Mutation("native/watch/crash.c", "        const ucontext_t *ucontext = first_delivery(sig, ucontext_here, &si);",
             "        const ucontext_t *ucontext = ucontext_here;",
             "tests/test_crash.py::test_faulthandler_enabled_after_us_passes_the_signal_on",
             "crash report: with faulthandler enabled after it, the report is of faulthandler's re-raise on the "
             "alternate stack: Python frames only, no native frame of the fault"),
    Mutation("native/capture/arch/x86_64.c", "offsetof(ucontext_t, uc_sigmask) + sizeof(uint64_t);",
             "offsetof(ucontext_t, uc_sigmask);",
             "tests/test_crash.py::test_a_reraising_handler_s_siginfo_gives_the_fault_address",
             "crash report: a signal passed on by an SA_SIGINFO handler loses the first delivery's fault address"),
    Mutation("native/capture/modules.c", "    if (pthread_mutex_trylock(&modules_mutex) != 0)",
             "    if (pthread_mutex_lock(&modules_mutex) != 0)",
             "tests/test_crash.py::test_crash_holding_btcore_s_lock_does_not_hang",
             "crash report: a crash inside btcore's capture, which holds the module list lock, waits for that lock "
             "forever: the process hangs instead of dying"),
    Mutation("native/capture/signal_capture.c", "ctx.regs.sp >= info->stack_lo - GUARD_BYTES", "ctx.regs.sp >= info->stack_lo",
             "tests/test_crash.py::test_stack_overflow_reported_from_the_alternate_stack",
             "crash report: a stack overflow's sp is off the stack: Python frames only"),
    Mutation("native/watch/crash.c", "    bool fault = si && si->si_code > 0 && sig != SIGABRT;", "    bool fault = si;",
             "tests/test_crash.py::test_abort",
             "crash report: abort() is reported as a fault at a meaningless address"),
    Mutation("native/watch/crash.c", "on_fatal_signal)\n            sigaction(fatal_signals[i], &previous[i], NULL);",
             "on_fatal_signal)\n            (void)now;",
             "tests/test_crash.py::test_disabled_and_environment_switch", "crash report: disable_crash_report() leaves the handlers"),
    Mutation("src/btcore/__init__.py", 'get("BTCORE_CRASH_REPORT") == "1"', 'get("BTCORE_CRASH_REPORT") == "yes"',
             "tests/test_crash.py::test_disabled_and_environment_switch", "crash report: BTCORE_CRASH_REPORT=1 does not enable it"),
    Mutation("src/btcore/capture/introspect.py", "    if type(ident) is not int or not 0 <= ident < 1 << 64:\n        return None\n", "",
             "tests/test_introspect.py::test_python_frames_of_another_thread_are_cpythons_chain",
             "a greenlet running in a thread that was not identified fails the snapshot (TypeError: the web page's 500)"),
    Mutation("native/capture/capture.c", "    source_of_chain(&src, &py);\n    python_only(s, &src);\n    return 0;",
             "    return 0;", "tests/test_introspect.py::test_python_frames_of_another_thread_are_cpythons_chain",
             "another thread's Python frames: none are read"),
    Mutation("native/capture/spawn_notes.c", "    if (v && is_dead(g)) {", "    if (v) {",
             "tests/test_spawn_notes.py::test_no_note_when_the_greenlet_did_not_die",
             "exception note: an exception a live greenlet threw into its parent is noted as escaping it"),
    Mutation("native/capture/spawn_notes.c", "switch_impl(self, args, kwargs);\n    if (!r)\n        escaped(self);",
             "switch_impl(self, args, kwargs);", "tests/test_spawn_notes.py::test_plain_greenlet_three_generations",
             "exception note: none for an exception leaving a greenlet through switch()"),
    Mutation("native/capture/spawn_notes.c", "throw_impl(self, args);\n    if (!r)\n        escaped(self);",
             "throw_impl(self, args);", "tests/test_spawn_notes.py::test_throw_into_a_greenlet_that_dies",
             "exception note: none for an exception leaving a greenlet through throw()"),
    Mutation("native/capture/spawn_notes.c", "PyExceptionInstance_Check(exc) ? has_chain_note(exc, header) : 1;",
             "PyExceptionInstance_Check(exc) ? 0 : 1;",
             "tests/test_spawn_notes.py::test_plain_greenlet_three_generations",
             "exception note: added again for every spawner the exception escapes"),
    Mutation("src/btcore/capture/spawn_notes.py", "    if len(lines) > room:", "    if False:", "tests/test_spawn_notes.py::test_note_bounded",
             "exception note: a deep spawn chain makes a note of unbounded length"),
    Mutation("native/capture/spawn.c", "return PyList_Append(key, NODE_SITE(node)) < 0 || PyList_Append(",
             "return PyList_Append(",
             "tests/test_spawn_notes.py::test_each_chain_its_own_note",
             "exception note: kept texts keyed without the sites: another site's chain is printed"),
    Mutation("native/capture/spawn_notes.c", "? Py_XNewRef(PyDict_GetItemWithError(kept, key)) : NULL;",
             "? NULL : NULL;", "tests/test_spawn_notes.py::test_a_kept_text_is_added_without_rendering",
             "exception note: every failure renders its chain again (the kept texts are never used)"),
    Mutation("src/btcore/capture/spawn_notes.py", "    if len(_rendered) >= NOTE_CACHE:", "    if False:",
             "tests/test_spawn_notes.py::test_kept_texts_bounded",
             "exception note: the rendered texts kept grow with every failing chain"),
    Mutation("src/btcore/capture/spawn_notes.py", "            _note_quietly(value, context)", "            pass",
             "tests/test_spawn_notes.py::test_gevent_spawn_pool_spawn_later",
             "exception note: none for gevent Greenlets (Hub.handle_error)"),
    Mutation("src/btcore/capture/spawn_notes.py", "        sys.meta_path.insert(0, _finder)", "        pass",
             "tests/test_spawn_notes.py::test_gevent_imported_after_enabling",
             "exception note: none for gevent when gevent is imported after enabling"),
    Mutation("src/btcore/capture/spawn.py", "    set_exception_notes(exception_notes)   # first", "    set_exception_notes(True)   # first",
             "tests/test_spawn_notes.py::test_off_switch_and_restore", "exception note: exception_notes=False does not turn notes off"),
    Mutation("src/btcore/capture/introspect.py", "        infos.extend(tasks.task_infos(threads))", "        pass",
             "tests/test_tasks.py::test_every_task_is_listed_with_its_state",
             "snapshot() lists no asyncio task"),
    Mutation("src/btcore/capture/tasks.py", "    return current_ident() if loop is mine else getattr(loop, \"_thread_id\", None)", "    return current_ident() if loop is mine else None",
             "tests/test_tasks.py::test_a_loop_in_another_thread",
             "a task's thread is unknown: a running task of another thread gets no stack"),
    Mutation("src/btcore/capture/tasks.py", "    infos = [info for info in (read_optional(_info_of, task) for task", "    infos = [info for info in (_info_of(task) for task",
             "tests/test_tasks.py::test_a_task_whose_methods_fail_is_left_out",
             "a Task subclass whose methods raise fails the whole snapshot"),
    Mutation("src/btcore/capture/tasks.py", "        coro = (getattr(coro, \"cr_await\", None) or", "        coro = (None or",
             "tests/test_tasks.py::test_own_frames_match_get_stack_and_the_awaits",
             "a suspended task's stack stops at its outermost coroutine, as Task.get_stack() does"),
    Mutation("src/btcore/capture/tasks.py", "    frames, walked = collections.deque(maxlen=limit), 0", "    frames, walked = collections.deque(), 0",
             "tests/test_tasks.py::test_a_deep_await_chain_keeps_its_innermost_frames",
             "a task's await chain is unbounded"),
    Mutation("src/btcore/capture/tasks.py", "            found.append(owner)\n            continue", "            continue",
             "tests/test_tasks.py::test_await_chain_follows_awaiters",
             "a task awaiting another task directly is not seen as its awaiter"),
    Mutation("src/btcore/capture/tasks.py", "            if isinstance(ref, _FUTURES) and depth < _AWAIT_DEPTH:", "            if False:",
             "tests/test_tasks.py::test_await_chain_follows_awaiters",
             "awaiters through gather, wait_for and shield (a future between the tasks) are lost"),
    Mutation("src/btcore/capture/tasks.py", "                found.append(ref._parent_task)", "                pass",
             "tests/test_tasks.py::test_await_chain_follows_awaiters",
             "a TaskGroup's tasks are not awaited by the group's task"),
    Mutation("src/btcore/capture/tasks.py", "        found.extend(_asyncio_task_lists(asyncio.Task, node_offset))", "        pass",
             "tests/test_tasks.py::test_every_task_is_listed_with_its_state",
             "3.14+: C tasks, kept in per-thread C lists, are not listed", since=(3, 14)),
    Mutation("native/capture/cpython/asyncio_lists.c",
             "    if (found && add_list(found, &interp->asyncio_tasks_head, offset, type) < 0)", "    if (0)",
             "tests/test_tasks.py::test_tasks_left_by_a_thread_that_ended",
             "3.14+: tasks left by a thread that ended (moved to the interpreter's list) are not listed",
             since=(3, 14)),
    Mutation("native/capture/spawn.c", "    if (off == 0)\n        return NULL;", "    if (off <= 0)\n        return NULL;",
             "tests/test_tasks.py::test_three_generations_of_tasks_record_their_creators",
             "3.12+: tasks (managed weakref lists, a negative offset) get no record", since=(3, 12)),
    Mutation("native/capture/spawn.c", "        swap_new(task_type, task_original_new, tracked_task_new);", "        ;",
             "tests/test_tasks.py::test_three_generations_of_tasks_record_their_creators",
             "3.14+: C tasks, which register in C lists, are not tracked", since=(3, 14)),
    Mutation("native/capture/cpython/chain.h", "        if (f->owner >= BTC_BOUNDARY_OWNER)\n            return (uintptr_t)f;",
             "        if (f->owner >= BTC_BOUNDARY_OWNER)\n            return 0;",
             "tests/test_tasks.py::test_a_sites_walk_ends_in_the_eval_loop_call_of_its_creator",
             "3.12+: a task's native spawn site runs on through the loop to the thread's bottom", since=(3, 12)),
    Mutation("native/capture/spawn.c", "    if (running)\n        return Py_NewRef(running);", "    if (0)\n        return NULL;",
             "tests/test_tasks.py::test_three_generations_of_tasks_record_their_creators",
             "3.14+: a task's creator is not the running C task (3.14 keeps it in the thread state)",
             since=(3, 14)),
    Mutation("src/btcore/capture/tasks.py", "        awaiting = known.awaited_by if known is not None else", "        awaiting = [] if True else",
             "tests/test_tasks.py::test_await_chain_follows_awaiters",
             "a task's await chain stops at its first awaiter"),
    Mutation("src/btcore/capture/tasks.py", "                info.under = above", "                pass",
             "tests/test_tasks.py::test_await_chain_follows_awaiters",
             "the tree does not draw a task under the task awaiting it"),
    Mutation("src/btcore/views/dump.py", "        key = memo[raw] = memo.setdefault(tuple(key), len(memo))",
             "        key = memo[raw] = len(memo)",
             "tests/test_introspect.py::test_stacks_differing_only_in_interpreter_frames_are_one_group",
             "a stack key stands for its raw records, not for the frames a reader sees: one stack in two groups"),
    Mutation("src/btcore/views/dump.py", '    tasks = len(infos) - [getattr(info, "task", None) for info in infos].count(None)',
             "    tasks = 0",
             "tests/test_tasks.py::test_dump_groups_tasks_and_draws_who_awaits_whom",
             "dumps count asyncio tasks as greenlets"),
    Mutation("src/btcore/views/dump.py", "    if creator is not None and _pending_task(creator):", "    if False:",
             "tests/test_tasks.py::test_three_generations_of_tasks_record_their_creators",
             "a dump names a live creating task by its repr from when it created, not as tasks are named"),
    Mutation("src/btcore/capture/spawn.py", "            registry.add = _spawn_task_hook(registry.add, current_tasks, bases, _weakset_parts(registry))",
             "            pass",
             "tests/test_tasks.py::test_three_generations_of_tasks_record_their_creators",
             "spawn tracking does not track asyncio tasks"),
    Mutation("native/capture/spawn.c", "    int added = PySet_Add(entries, (PyObject *)r);", "    int added = 0;",
             "tests/test_tasks.py::test_a_tracked_tasks_record_is_its_registry_entry",
             "a tracked task is never added to asyncio's registry: all_tasks() leaves it out"),
    Mutation("native/capture/spawn.c", "    PyObject *result = self ? PyObject_CallOneArg(self, ref) : Py_NewRef(Py_None);",
             "    PyObject *result = Py_NewRef(Py_None);",
             "tests/test_tasks.py::test_a_tracked_tasks_record_is_its_registry_entry",
             "a tracked task's registry entry outlives it: asyncio's registry grows with every task"),
    Mutation("native/capture/spawn.c", "PyList_CheckExact(pending) && PyList_GET_SIZE(pending) == 0));",
             "PyList_CheckExact(pending)));",
             "tests/test_tasks.py::test_a_task_made_while_the_registry_has_removals_pending_is_added_by_weakset",
             "a task made while the registry is iterated skips WeakSet.add()'s commit of the pending removals"),
    Mutation("native/capture/spawn.c", "? PyDict_GetItemWithError(current_tasks, loop) : NULL;", "? NULL : NULL;",
             "tests/test_tasks.py::test_three_generations_of_tasks_record_their_creators",
             "a task's creator is the thread's greenlet, never the task that created it"),
    Mutation("native/capture/capture.c", "        src->ahead_at = 0;\n", "        src->ahead_at = src->ahead_n ? 1 : 0;\n",
             "tests/test_collect.py::test_eval_calls_longer_than_a_read_ahead_keep_every_frame_in_place",
             "the first Python frame of every batch read ahead after the first is lost"),
    Mutation("native/capture/capture.c", "    return src->live && src->live->stopped && src->ahead_at == src->ahead_n;",
             "    return src->live && src->live->stopped;",
             "tests/test_tasks.py::test_direct_construction_and_custom_factories_are_tracked",
             "a task's spawn site ends once the stop frame is read ahead, before the merge has taken the frames "
             "up to it"),
    Mutation("native/capture/cpython/pyframes.h", "        if (stop && was == stop) {", "        if (0) {",
             "tests/test_tasks.py::test_three_generations_of_tasks_record_their_creators",
             "a task's spawn site ends its native walk at its creator's bottom, but its Python frames go on"),
    Mutation("native/capture/capture.c", "        py->stop = stop;", "        py->stop = NULL;",
             "tests/test_tasks.py::test_three_generations_of_tasks_record_their_creators",
             "a task's spawn site goes on through the loop's frames, in every generation"),
    Mutation("src/btcore/watch/watchdog.py", "            return select.__code__, 0, 0", "            return None, 0, 0",
             "tests/test_tasks.py::test_watchdog_reports_a_loop_stuck_in_one_callback[time.sleep-None-asyncio]",
             "an asyncio loop waiting in its selector is reported as stuck"),
    Mutation("src/btcore/watch/watchdog.py", "    return (runner.f_code, *span)", "    return None",
             "tests/test_tasks.py::test_watchdog_reports_a_loop_stuck_in_one_callback[time.sleep-None-uvloop]",
             "a uvloop loop waiting for events in libuv is reported as stuck"),
    Mutation("native/watch/watchdog.c", "        if (in_code(pc, atomic_load(&w->interpreter_lo), atomic_load(&w->interpreter_hi)))\n"
             "            return false;\n", "",
             "tests/test_tasks.py::test_watchdog_reports_a_loop_stuck_in_a_callback_written_in_c[uvloop]",
             "a uvloop loop blocked by a C callback (time.sleep given to call_soon) is taken for one waiting for "
             "events: no report"),
    Mutation("native/capture/signal_capture.c",
             "        at = &l->code_copy;", "        at = NULL;",
             "tests/test_tasks.py::test_watchdog_reports_a_loop_stuck_in_one_callback[time.sleep-None-asyncio]",
             "a stuck sample holding a coroutine frame loses every Python frame (its code object's copy is refused)"),
    Mutation("src/btcore/views/fold.py", "    if not module or not function:\n        return False, False",
             "    if not module:\n        return False, False\n    function = function or 'PyObject_Vectorcall'",
             "tests/test_format.py::test_fold_never_hides_unnamed_or_foreign_frames",
             "the readable view folds frames that have no name"),
    Mutation("native/codec/encode.c", "put(w, (uint64_t)best_k | (uint64_t)best_negative << 2, 3);",
             "put(w, (uint64_t)best_k, 3);",
             "tests/test_codec.py::test_c_encoder_writes_the_reference_token_cold_and_warm",
             "the C encoder drops the sign of a delta-coded pc (the frame decodes elsewhere)"),
    Mutation("src/btcore/codec.py", "        return index if index < self.seen else count",
             "        return index",
             "tests/test_codec.py::test_literal_modules_and_lengths_of_every_size_round_trip",
             "a format 3 literal pc in no module is decoded as a pc of the next module not named yet"),
    Mutation("native/codec/encode.c", "        put(w, new, 1);", "        put(w, 1, 1);",
             "tests/test_codec.py::test_c_encoder_writes_the_reference_token_cold_and_warm",
             "the C encoder marks every literal pc as one of a module not named yet"),
    Mutation("src/btcore/codec.py", "        if distance < length:", "        if False:",
             "tests/test_codec.py::test_copies_outside_the_decoded_frames_overlapping_or_past_the_count_are_refused",
             "a copy that overlaps the frames it writes is decoded (it would read records not written yet)"),
    Mutation("src/btcore/codec.py", "        if not MIN_COPY <= length <= count - done:",
             "        if not MIN_COPY <= length:",
             "tests/test_codec.py::test_copies_outside_the_decoded_frames_overlapping_or_past_the_count_are_refused",
             "a copy writes past the token's frame count (and a 2^40-frame copy is attempted)"),
    Mutation("src/btcore/codec.py", "            if self.string_budget < 0:", "            if False:",
             "tests/test_codec.py::test_strings_taken_whole_from_earlier_ones_are_bounded",
             "strings taken whole from earlier ones are unbounded: a 100 k-character token decodes to 20 MB"),
    Mutation("src/btcore/codec.py", "                first = (first + count) << 1", "                first = first + count",
             "tests/test_codec.py::test_c_encoder_codes_every_byte_and_word_as_the_reference",
             "the Huffman decoder reads codes longer than the shortest wrongly: strings decode to other bytes"),
    Mutation("native/codec/encode.c", "        if (length >= MIN_COPY) {", "        if (length > MIN_COPY) {",
             "tests/test_codec.py::test_repetitive_traces_round_trip_through_copies",
             "the C encoder writes no copy of two frames: its token differs from the reference's"),
    Mutation("native/codec/encode.c", "    while (start > from && natives < HISTORY)",
             "    while (start > from && natives < 1)",
             "tests/test_codec.py::test_repetitive_traces_round_trip_through_copies",
             "after a copy the C encoder remembers one native frame, not four: repeats and deltas refer elsewhere"),
    Mutation("native/codec/encode.c", "    return (e->newest - (unsigned)k) & (HISTORY - 1);",
             "    return (e->newest + (unsigned)k) & (HISTORY - 1);",
             "tests/test_codec.py::test_c_encoder_writes_the_reference_token_cold_and_warm",
             "the C encoder's ring of recent native frames is read the wrong way: repeats and deltas refer elsewhere"),
    Mutation("native/codec/encode.c", "        if (most <= best || !same_key(&places[j + best], &places[i + best]))",
             "        if (most <= best || same_key(&places[j + best], &places[i + best]))",
             "tests/test_codec.py::test_repetitive_traces_round_trip_through_copies",
             "the C encoder skips the earlier runs that could be longer than the best so far: fewer, shorter copies"),
    Mutation("native/codec/encode.c", "                p->index = e->nmodules;   /* no module */",
             "                p->index = 0;   /* no module */",
             "tests/test_codec.py::test_c_encoder_writes_pcs_in_no_module_and_modules_named_again_as_the_reference",
             "the C encoder writes a pc in no module as one of the token's first module"),
    Mutation("native/codec/encode.c",
             "    if (slot->str == s->object && slot->prefix == prefix && slot->suffix == suffix) {",
             "    if (slot->str == s->object) {",
             "tests/test_codec.py::test_c_encoder_codes_a_name_again_when_it_shares_another_part_of_an_earlier_one",
             "a string's cached codes are written for another prefix and suffix than they were coded for"),
    Mutation("native/codec/encode.c", "    bool keep = nwords <= MAX_CODED_WORDS && evict(slot->str);",
             "    bool keep = evict(slot->str);",
             "tests/test_codec.py::test_c_encoder_codes_a_name_again_when_it_shares_another_part_of_an_earlier_one",
             "a string's codes longer than a cache entry are kept in it anyway (written past the entry)"),
    Mutation("native/codec/encode.c", "    uint32_t code = 0;", "    uint32_t code = 1;",
             "tests/test_codec.py::test_c_encoder_codes_every_byte_and_word_as_the_reference",
             "the C encoder's canonical Huffman codes are shifted: its strings decode to other bytes"),
    Mutation("src/btcore/codec.py", "    if count and length < MIN_BUILD_ID_BYTES:", "    if False:",
             "tests/test_codec.py::test_a_build_id_prefix_too_short_to_tell_builds_apart_is_refused",
             "a token's 2-byte build-id prefixes are trusted: frames named from whatever build shares them"),
    Mutation("src/btcore/codec.py", "    if on_disk[:len(build_id)] != build_id:", "    if False:",
             "tests/test_codec.py::test_rebuilt_module_is_reported_as_a_build_id_mismatch",
             "a decoded token's frames are named from a rebuilt library whose build-id no longer matches"),
    # Files named by others (issue 25 items 2, 3, 7): mid-list, where no other branch appends.
    Mutation("native/symbols/elf.c", "        if (!S_ISREG(st.st_mode))", "        if (0)",
             "tests/test_token_files.py::test_a_fifo_named_in_a_token_is_never_opened",
             "a FIFO (or a device) named in a token is opened through /proc/self/fd: its blocked writer wakes up"),
    Mutation("native/symbols/elf.c", "    int at = open(path, O_PATH | O_CLOEXEC);",
             "    int at = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);",
             "tests/test_token_files.py::test_a_fifo_named_in_a_token_is_never_opened",
             "a path is opened to be checked: a FIFO's writer wakes up, a device's driver runs"),
    Mutation("native/symbols/elf.c", "    int fd = btc_open_regular(path, NULL);", "    int fd = open(path, O_RDONLY | O_CLOEXEC);",
             "tests/test_token_files.py::test_a_fifo_as_the_debug_link_target_is_never_opened",
             "the native reader opens the files it finds itself (debug links) blocking: a FIFO there hangs decode"),
    Mutation("src/btcore/codec.py", '        if (_fd_build_id(fd) or b"")[:len(want)] != want:', "        if False:",
             "tests/test_token_files.py::test_a_file_swapped_after_decode_is_not_read",
             "a token's file swapped for another build after decode() names the frames from that build"),
    Mutation("src/btcore/codec.py", "        symbol, start = file_symbol(module.path, lookup, fd)",
             "        symbol, start = file_symbol(module.path, lookup); fd = -1",
             "tests/test_token_files.py::test_names_are_read_through_the_descriptor_checked",
             "names are read from the path opened again, not from the file whose build-id was checked"),
    Mutation("native/symbols/dwarf_units.c", "        if (u->in_aranges || !dwarf_prepare_unit(d, u) ||",
             "        if (!dwarf_prepare_unit(d, u) ||",
             "tests/test_symbolize.py::test_unit_with_ranges_found_after_a_miss",
             "a miss in .debug_aranges reads every unit's DIEs (libc's first symbol-less address: seconds)"),
    Mutation("native/remote/rmodules.c", "    int fd = btc_open_regular(path, NULL);   /* the target's maps name it: never a FIFO or a device */",
             "    int fd = open(path, O_RDONLY | O_CLOEXEC);",
             "tests/test_token_files.py::test_a_dumped_process_whose_library_became_a_fifo",
             "the outside dump opens a path of the target's maps blocking: a FIFO there hangs the dumper"),
    Mutation("native/symbols/elf.c", "    if (fd < 0 && errno == ENOENT)", "    if (0)",
             "tests/test_token_files.py::test_without_proc_regular_files_are_still_read_and_fifos_refused",
             "without /proc mounted no file can be read: every frame loses its name"),
    Mutation("native/symbols/elf.c", "        else if (st.st_size < (off_t)sizeof(Elf64_Ehdr))", "        else if (0)",
             "tests/test_token_files.py::test_files_smaller_than_an_elf_header_are_not_read",
             "a procfs file named in a token is opened and read (/proc/kmsg: a kernel message consumed)"),
    Mutation("native/capture/signal_capture.c", "            build_table_at(out->pending_pc);",
             "            (void)0;",
             "tests/test_watchdog.py::test_report_comes_while_stuck_and_names_both_sides",
             "a sample that stopped at a module without an unwind table is not retaken after building it: "
             "the report loses every native frame between the stuck C function and its Python caller"),
    Mutation("native/watch/watchdog.c", "*out = __atomic_load_n(p, __ATOMIC_RELAXED);", "*out = 0;",
             "tests/test_watchdog.py::test_greenlets_switching_back_and_forth_between_ticks_are_not_stuck",
             "the watchdog stops seeing greenlet's switch count: a thread switching all the time is reported stuck"),
    Mutation("native/watch/watchdog.c", "return i >= 0 && idle_code && sample->frames[i].addr == idle_code && (", "return false && (",
             "tests/test_watchdog.py::test_gevent_hub_waiting_is_idle_not_stuck",
             "a thread waiting in gevent's hub for events is reported stuck"),
    Mutation("src/btcore/__init__.py", "_os.register_at_fork(before=_load_all)", "",
             "tests/test_fork.py::test_a_fork_finds_every_part_of_btcore_imported",
             "a fork while another thread imports a part of btcore leaves the child waiting on that import for ever"),
    Mutation("src/btcore/__init__.py", "    globals()[name] = value   # found directly from now on\n", "",
             "tests/test_backtrace_api.py::test_import_btcore_loads_no_part_until_a_name_is_used",
             "every use of a public name goes through __getattr__ and an import lookup"),
    Mutation("native/remote/rpython.c", "        gs[reader[r]].copied = ok[r];", "        gs[r].copied = ok[r];",
             "tests/test_hostile_dump.py::test_a_corrupt_greenlet_before_a_healthy_one_leaves_it_its_heap_copy",
             "a batched heap-copy read is credited to the wrong greenlet: a corrupt greenlet takes a healthy one's"),
    Mutation("src/btcore/remote/names.py", "    if len(head) + len(tail) + 16 > MAX_NAME:", "    if False:",
             "tests/test_remote_names.py::test_a_plain_label_is_the_whole_text_shown_whatever_the_type_name",
             "an unnamed greenlet of an absurdly long type name gets a label past MAX_NAME"),
    Mutation("native/remote/rpython.c",
             "copy_is_whole(g) && g->spill_at <= spill_size && (uint64_t)g->saved <= spill_size - g->spill_at",
             "copy_is_whole(g)",
             "tests/test_hostile_dump.py::test_garbage_target_images_through_the_remote_readers",
             "a greenlet row of another stop points the walk past the end of this stop's heap copies"),
    Mutation("native/remote/rpython.c", "            st->size = (uint64_t)g->saved;", "            st->size = 0;",
             "tests/test_process_dump.py::test_outside_text_equals_dump_all_inside",
             "the suspended greenlets whose heap copy is all of their stack are dumped without native frames"),
    Mutation("native/remote/rpython.c", "(g->bad != 0 && g->bad != BTC_REMOTE_BAD_FRAME)", "(g->bad != 0)",
             "tests/test_hostile_dump.py::test_a_greenlet_whose_top_frame_is_unreadable_keeps_its_native_frames",
             "a greenlet whose top frame is unreadable loses its native frames too, though its saved stack is sound"),
    Mutation("native/watch/report.c", "    add_str_read(t, (uintptr_t)code.co_filename, read);",
             "    add_str(t, code.co_filename);",
             "tests/test_watchdog.py::test_a_sample_names_code_objects_it_cannot_read_without_reading_them",
             "a sample reads its code objects' file names in place: one freed since the capture crashes the process"),
    Mutation("native/watch/report.c", "if (levels > 0 && level.file && level.line > 0)", "if (0)",
             "tests/test_watchdog.py::test_report_comes_while_stuck_and_names_both_sides",
             "the stuck report loses the native frames' file:line"),
    Mutation("native/watch/dump_signal.c", "            dump_thread(i);", "            (void)i;",
             "tests/test_watchdog.py::test_stuck_dump_shows_another_thread_holding_the_gil_in_c",
             "the stuck dump shows the registering thread only: another thread holding the GIL in C is not shown"),
    Mutation("src/btcore/views/dump.py", "        if entry is not _STUCK:\n            lib.btc_prompt_signal_uninstall(signum)",
             "        pass",
             "tests/test_signal_dump.py::test_the_nudge_is_gone_before_the_interpreter_ends",
             "the nudge stays at exit: one armed when the interpreter puts SIG_DFL back ends the process"),
    Mutation("native/watch/prompt_signal.c", "            arm(p, FIRST_NS);", "            (void)p;",
             "tests/test_signal_dump.py::test_a_pending_dump_interrupts_the_main_threads_wait[gevent]",
             "no nudge after a dump signal: gevent's idle hub runs the owed handler only when its sleep ends"),
    Mutation("native/watch/prompt_signal.c", "        p->target = gettid();\n        atomic_store(&p->seen",
             "        atomic_store(&p->seen",
             "tests/test_signal_dump.py::test_a_pending_dump_interrupts_the_main_threads_wait[fork]",
             "a forked child's nudges are aimed at the parent's main thread: the child's wait is not interrupted"),
    Mutation("native/capture/signal_capture.c", "take_slot(i, t->thread_id, (pid_t)t->native_thread_id,",
             "take_slot(i, t->thread_id, (pid_t)syscall(SYS_gettid),",
             "tests/test_watchdog.py::test_stuck_dump_shows_another_thread_holding_the_gil_in_c",
             "a thread registered by another one is signalled at the registering thread's kernel id: it never answers"),
    Mutation("native/symbols/dwarf_units.c", "    if (e->ranges.kind == V_RNGLISTX) {",
             "    if (e->low_pc.kind != V_NONE) {} else if (e->ranges.kind == V_RNGLISTX) {",
             "tests/test_symbolize.py::test_unit_with_ranges_found_after_a_miss",
             "a unit with DW_AT_ranges and a base DW_AT_low_pc covers nothing once a miss in .debug_aranges "
             "rebuilt the unit table from the DIEs: every later lookup in it loses file:line"),
    Mutation("native/watch/watchdog.c", "} else if (shown->partial & ~sample->partial) {", "} else if (false) {",
             "tests/test_watchdog.py::test_a_repeat_after_a_partial_report_shows_the_whole_stack[2]",
             "after a partial report, the next shows only frames that changed against it: frames the partial "
             "one lacked are never shown"),
    Mutation("native/watch/watchdog.c", "    s->shown = true;", "    s->shown = false;",
             "tests/test_watchdog.py::test_a_later_report_of_the_same_stuck_call_says_same_stack",
             "every report of one stuck call repeats the whole stack (the ~35 lines of a request handler)"),
    Mutation("native/watch/watchdog.c",
             "if (outer == n && n == frame_count(shown) && sample->partial == shown->partial) {", "if (false) {",
             "tests/test_watchdog.py::test_a_later_report_of_the_same_stuck_call_says_same_stack",
             "a stuck call still where it was is reported as changed, never as 'the same stack'"),
    Mutation("native/watch/watchdog.c", "a->addr == b->addr && a->lasti == b->lasti &&", "a->addr == b->addr &&",
             "tests/test_watchdog.py::test_a_later_report_whose_inner_stack_changed_shows_only_the_inner_frames",
             "a Python frame now at another line of its function is taken for the one already shown: the "
             "changed line is not shown"),
    Mutation("native/watch/watchdog.c", "        m++;", "        break;",
             "tests/test_watchdog.py::test_a_later_report_whose_inner_stack_changed_shows_only_the_inner_frames",
             "no outer frame is found in common: a changed stack is shown whole again"),
    Mutation("native/watch/watchdog.c", "        btc_sigsample_inner_text(sample, n - outer, t);",
             "        btc_sigsample_text(sample, t);",
             "tests/test_watchdog.py::test_a_later_report_whose_inner_stack_changed_shows_only_the_inner_frames",
             "a changed stack's report says 'the inner N frames' but prints every frame"),
    Mutation("native/watch/report.c", "    int n = inner < s->n ? inner : s->n;", "    int n = s->n;",
             "tests/test_watchdog.py::test_a_later_report_whose_inner_stack_changed_shows_only_the_inner_frames",
             "the inner frames' text runs on into the outer frames already shown"),
    Mutation("src/btcore/capture/introspect.py", "    return owners[0] if len(owners) == 1 else None",
             "    return None",
             "tests/test_patched_threads.py::test_gevent_threadpool_threads_are_named_and_known",
             "greenlets are not mapped to threads by their stack marks: two busy gevent threadpool threads "
             "cannot be paired by elimination and their greenlets are of an unknown thread"),
    Mutation("native/capture/greenlet_context.c", "    return s.start > 1 ? s.start : 0;", "    return 0;",
             "tests/test_patched_threads.py::test_gevent_threadpool_threads_are_named_and_known",
             "a suspended main greenlet has no stack mark: its thread is told only by a hub or by elimination"),
    Mutation("src/btcore/capture/introspect.py", "and id(above) not in hubs:", ":",
             "tests/test_patched_threads.py::test_eventlet_tree_is_by_spawner_never_under_the_hub",
             "an eventlet green thread whose spawner is unknown is drawn under the hub, which runs them all"),
    Mutation("native/capture/spawn.c", "    r->creator = Py_NewRef((PyObject *)p->spawner);", "",
             "tests/test_patched_threads.py::test_eventlet_tree_is_by_spawner_never_under_the_hub",
             "spawn tracking forgets the creator greenlet: eventlet's tree loses its spawners"),
    Mutation("src/btcore/capture/introspect.py", "    found = {current_root: current_ident()}",
             "    found = {current_root: __import__('threading').get_ident()}",
             "tests/test_patched_threads.py::test_gevent_labels_are_the_os_threads_in_every_dump",
             "the calling thread is labelled with the patched get_ident: the id of whichever greenlet dumps"),
    Mutation("src/btcore/capture/threads.py", "    if native_id == os.getpid():", "    if False:",
             "tests/test_patched_threads.py::test_gevent_labels_are_the_os_threads_in_every_dump",
             "the main thread is named only through threading's dict, where gevent re-keyed it: no MainThread"),
    Mutation("src/btcore/capture/threads.py", "    if ident in workers:", "    if False:",
             "tests/test_patched_threads.py::test_gevent_threadpool_threads_are_named_and_known",
             "a gevent threadpool thread (started without threading) gets no name but its kernel id"),
    Mutation("src/btcore/capture/introspect.py",
             "        if info is not None and getattr(cb, \"__name__\", None) == \"switch\" and args:",
             "        if False:",
             "tests/test_patched_threads.py::test_eventlet_names_carry_the_function_and_threads_are_real",
             "an eventlet green thread not started yet is named without the function its hub will start"),
    Mutation("native/btcore_api.h", "#define BTC_SPAWN_DEFAULT_CAPACITY 1024", "#define BTC_SPAWN_DEFAULT_CAPACITY 32",
             "tests/test_spawn.py::test_deep_three_generations_complete_by_default",
             "the default spawn capacity is used up by one deep handler's site: every chain truncated (issue 24)"),
    Mutation("native/capture/spawn.c", "Py_SETREF(n, Py_XNewRef(NODE_PARENT(n)));",
             "Py_SETREF(n, Py_NewRef(n));",
             "tests/test_spawn.py::test_deep_three_generations_complete_by_default",
             "a spawn chain is not followed to the creators' records: every generation shows the newest site"),
    Mutation("native/capture/spawn.c", "        return Py_NewRef(Py_Ellipsis);", "        return Py_NewRef(Py_None);",
             "tests/test_spawn.py::test_ten_thousand_generations_bounded_newest_kept",
             "a chain cut back to its newest generations no longer says older ones were dropped"),
    Mutation("src/btcore/views/dump.py", "        key = (tuple(site_key(site) for site, _, _ in chain.links), chain.cut)",
             "        key = ()",
             "tests/test_spawn.py::test_dump_group_lists_distinct_spawn_sites_with_counts",
             "a dump group shows one spawn site for members spawned from different places (issue 24)"),
    Mutation("src/btcore/views/dump.py", "    if isinstance(creator, greenlet.greenlet) and not base_dead(creator):",
             "    if isinstance(creator, greenlet.greenlet):",
             "tests/test_spawn.py::test_dump_group_lists_distinct_spawn_sites_with_counts",
             "a creator that has ended is named by what gevent says of it now (its function gone), not by its repr"),
    Mutation("src/btcore/capture/introspect.py", "        if state != DEAD and g is not writer_root:",
             "        if state != DEAD:",
             "tests/test_deployments.py::test_eventlet_thread_label_is_the_os_thread",
             "the dump writer's own main greenlet (made by naming and rendering in that thread) is listed, "
             "in a thread nothing names: every signal dump shows an 'unknown thread'"),
    Mutation("src/btcore/capture/introspect.py", "        if pause is not None and done and done % PAUSE_EVERY == 0:",
             "        if False:",
             "tests/test_introspect.py::test_a_snapshot_in_steps_pauses_and_leaves_out_greenlets_that_ended",
             "snapshot(pause=) never pauses: the web view's snapshot of 10,000 greenlets holds the loop in one step"),
    Mutation("src/btcore/capture/introspect.py", "            if state == DEAD:\n                continue",
             "            if False:\n                continue",
             "tests/test_introspect.py::test_a_snapshot_in_steps_pauses_and_leaves_out_greenlets_that_ended",
             "a greenlet that ended during a pause of the snapshot is listed, as a dead greenlet's stack"),
    Mutation("native/capture/greenlet_objects.c", "    if (root == current_root)\n        return SUSPENDED;", "",
             "tests/test_introspect.py::test_known_states_before_greenlets_layout_is_learned_take_a_frameless_main_greenlet_as_its_runner",
             "a frameless greenlet of the sampler's own thread (parked in C) is taken as running"),
    Mutation("native/capture/greenlet_objects.c", "    return root_framed < 0 ? ERROR : root_framed ? RUNNING : SUSPENDED;",
             "    return root_framed < 0 ? ERROR : RUNNING;",
             "tests/test_introspect.py::test_known_states_before_greenlets_layout_is_learned_take_a_frameless_main_greenlet_as_its_runner",
             "until greenlet's layout is learned, a greenlet of another thread whose main greenlet runs is taken as running"),
    Mutation("native/capture/greenlet_objects.c", "        return runs ? RUNNING : SUSPENDED;",
             "        return RUNNING;",
             "tests/test_introspect.py::test_known_states_sorts_the_profilers_greenlets_as_they_are",
             "a greenlet of another thread parked without Python frames is taken as running there"),
    Mutation("native/capture/greenlet_context.c", "    if (found != 1 || layout.thread_state_off + sizeof(void *) > layout.object_size)",
             "    if (found != 2 || layout.thread_state_off + sizeof(void *) > layout.object_size)",
             "tests/test_introspect.py::test_of_two_greenlets_without_python_frames_in_another_thread_the_one_it_runs_is_running",
             "where a thread's current greenlet is kept is not learned: a greenlet parked in C reads as running"),
    Mutation("src/btcore/capture/introspect.py",
             "        layout_known()\n    except BacktraceError:   # being learned on this thread: the fallback rule",
             "        pass\n    except BacktraceError:   # being learned on this thread: the fallback rule",
             "tests/test_introspect.py::test_of_two_greenlets_without_python_frames_in_another_thread_the_one_it_runs_is_running",
             "a process's first snapshot reads states before greenlet's layout is learned: a greenlet parked in C runs"),
    Mutation("src/btcore/profile/sampler.py", "                layout_known()\n", "                pass\n",
             "tests/test_profile.py::test_greenlets_parked_without_python_frames_in_a_thread_of_their_own_are_parked",
             "the profiler's first tick reads greenlets before greenlet's layout is learned: a frameless waiter runs"),
    Mutation("native/capture/signal_capture.c", "    if (n > BTC_READ_PIPED_MAX || pipe2(", "    if (n > 2 * BTC_READ_PIPED_MAX || pipe2(",
             "tests/test_contracts.py::test_piped_read_copies_readable_memory_and_refuses_the_rest",
             "a piped read above what a pipe takes without blocking is tried (a larger one would block)"),
    Mutation("native/capture/greenlet_objects.c",
             "            return seen->of[i].known < 0 ? -1 : seen->of[i].current == (uintptr_t)g;",
             "            return seen->of[i].known < 0 ? -1 : seen->of[i].current != (uintptr_t)g;",
             "tests/test_introspect.py::test_known_states_sorts_the_profilers_greenlets_as_they_are",
             "a thread's running greenlet, read once per call, is taken for another frameless one of that thread"),
    Mutation("native/capture/greenlet_context.c", "    *current = ((const uintptr_t *)ts)[1];",
             "    *current = ((const uintptr_t *)ts)[0];",
             "tests/test_introspect.py::test_of_two_greenlets_without_python_frames_in_another_thread_the_one_it_runs_is_running",
             "a thread's main greenlet is read as the greenlet it runs: the one running C code reads as suspended"),
    Mutation("native/capture/greenlet_objects.c", "((uintptr_t)g >> 4) % (uintptr_t)phases == (uintptr_t)phase",
             "((uintptr_t)g >> 4) % (uintptr_t)phases <= (uintptr_t)phase",
             "tests/test_introspect.py::test_known_states_sorts_the_profilers_greenlets_as_they_are",
             "a parked greenlet is in more than its own phase's turn"),
    Mutation("native/capture/greenlet_objects.c", "made_greenlet = PyObject_TypeCheck(o, greenlet_type) &&",
             "made_greenlet = Py_IS_TYPE(o, greenlet_type) &&",
             "tests/test_introspect.py::test_greenlets_of_a_subclass_made_after_import_are_found",
             "the gc scan finds greenlet.greenlet's own instances only: no gevent Greenlet in any dump"),
    Mutation("native/capture/greenlet_objects.c", " && btc_greenlet_made(greenlet_type, o);", ";",
             "tests/test_introspect.py::test_a_dump_run_while_greenlet_makes_a_greenlet_leaves_it_out",
             "the gc scan lists a greenlet still being made: a dump run inside greenlet's tp_new reads its missing C++ object"),
    Mutation("native/capture/greenlet_objects.c",
             "    if (!btc_greenlet_made(greenlet_type, g))\n        return NOT_STARTED;", "",
             "tests/test_introspect.py::test_a_dump_run_while_greenlet_makes_a_greenlet_leaves_it_out",
             "state_of() asks greenlet's accessors about a greenlet still being made: SIGSEGV"),
    Mutation("native/capture/greenlet_objects.c", "PyLong_FromLongLong(count + weight)", "PyLong_FromLongLong(count)",
             "tests/test_introspect.py::test_parked_unmoved_counts_only_the_greenlets_whose_stamp_is_kept_with_an_entry",
             "the profiler's unmoved parked greenlets are looked at and their time not counted"),
    Mutation("native/capture/greenlet_objects.c", "return kept != 0 && kept == btc_greenlet_stamp_held(g);",
             "return kept != 0;", "tests/test_introspect.py::test_parked_unmoved_counts_only_the_greenlets_whose_stamp_is_kept_with_an_entry",
             "a parked greenlet that moved is counted at the stack it had at its last look"),
    Mutation("native/capture/greenlet_objects.c", " || PyDict_SetItem(counted, key, now_obj) < 0)", ")", "tests/test_introspect.py::test_parked_unmoved_counts_only_the_greenlets_whose_stamp_is_kept_with_an_entry",
             "an unmoved parked greenlet's time is not marked counted: the next look counts it again"),
    Mutation("native/capture/capture.c", "    return rc == 0 && btc_backtrace_holds(bt, &(btc_raw_capture)",
             "    return rc == 0 || btc_backtrace_holds(bt, &(btc_raw_capture)", "tests/test_introspect.py::test_parked_unmoved_counts_only_the_greenlets_whose_stamp_is_kept_with_an_entry",
             "a frameless parked greenlet is taken as unmoved without its capture compared with the kept one"),
    Mutation("native/capture/greenlet_objects.c", "long long weight = now - since + more;", "long long weight = now - since;",
             "tests/test_introspect.py::test_parked_unmoved_counts_only_the_greenlets_whose_stamp_is_kept_with_an_entry", "an unmoved parked greenlet's unplaced time (parked where no look saw it) is dropped"),
    Mutation("native/capture/greenlet_context.c", "    if (!btc_greenlet_made(type, g))\n        return 0;", "",
             "tests/test_introspect.py::test_a_dump_run_while_greenlet_makes_a_greenlet_leaves_it_out",
             "collect() of a greenlet still being made asks greenlet's active(): SIGSEGV"),
    Mutation("src/btcore/capture/tasks.py", "        if _running(coro):\n            break", "",
             "tests/test_tasks.py::test_a_running_coroutines_await_is_not_read",
             "a running task's cr_await is read: 3.11 can return a word below its frame's stack (SIGSEGV)"),
    Mutation("src/btcore/capture/introspect.py", '    if getattr(tasks.__spec__, "_initializing", False):\n        return None', "",
             "tests/test_tasks.py::test_a_snapshot_inside_the_import_of_its_task_reader_leaves_tasks_out",
             "a dump run inside the import of the task reader fails on the half-made module"),
    Mutation('src/btcore/profile/sampler.py', '        weight = int((now - self._last) * 1e6)', '        weight = 1',
             'tests/test_profile.py::test_samples_weigh_the_time_they_stand_for',
             'every sample counts 1 instead of the time it stands for: a greenlet that computes delays the ticks in its run and is under-counted'),
    Mutation("src/btcore/profile/sampler.py", "        entry[0] += weight\n        return True", "        return True",
             "tests/test_profile.py::test_an_idle_threads_stack_is_reused_until_it_runs_again",
             "a thread that ran nothing since the last tick gets none of the tick's time"),
    Mutation("src/btcore/profile/sampler.py", "        if entry is None or before[1] is not None:",
             "        if entry is None:",
             "tests/test_profile.py::test_a_greenlet_running_in_a_still_thread_gets_its_time_once",
             "a still thread's known greenlet is counted in place, its time not marked counted: counted again as parked"),
    Mutation('src/btcore/profile/sampler.py', '        if found and lib.btc_thread_switch_count(ident) != switches:', '        if False:',
             'tests/test_profile.py::test_a_thread_that_switches_between_the_state_read_and_the_capture_is_not_mislabelled',
             "a thread that switched greenlets while the sampler waited for the GIL has the new greenlet's stack counted under the old one's name"),
    Mutation('src/btcore/profile/sampler.py',
             '            if _state_is_started(g) and (gevent_name or function or _base_parent(g) is None):',
             '            if _state_is_started(g):',
             'tests/test_profile.py::test_a_plain_greenlet_that_runs_between_its_stack_and_its_naming_is_named_in_full_later',
             "a plain greenlet named while it ran keeps a name without its function for the whole profile "
             "(gevent's hub as \"<gevent.hub.Hub>\": the guide's on-CPU share read 1.0 under ASan on CI)"),
    Mutation('src/btcore/profile/sampler.py', '        elif len(self._counts) < self.max_stacks:', '        elif True:',
             'tests/test_profile.py::test_memory_is_bounded_past_max_stacks_samples_go_to_other',
             'distinct stacks are kept without bound: memory grows with the duration'),
    Mutation('src/btcore/profile/sampler.py', '            if mode == "cpu" and state != RUNNING_STATE:', '            if False:',
             'tests/test_profile.py::test_on_cpu_time_goes_to_the_computing_greenlet_half_of_the_time',
             'the on-CPU view counts parked greenlets too'),
    Mutation('native/capture/spawn.c', "    if (note)\n        note_created(o);", "",
             'tests/test_profile.py::test_a_greenlet_made_while_sampling_is_found_without_a_heap_scan',
             'a greenlet made while the profiler samples is never found (no heap scan after the first tick)'),
    Mutation('native/capture/spawn.c', "    if (PyList_GET_SIZE(created) >= CREATED_MAX) {", "    if (0) {",
             'tests/test_profile.py::test_creations_beyond_what_the_hook_keeps_make_a_heap_scan',
             'the creation watch keeps every greenlet made between two ticks: unbounded memory'),
    Mutation('native/capture/spawn.c', "    if (enabled || created)\n        swap_new", "    if (enabled)\n        swap_new",
             'tests/test_profile.py::test_a_greenlet_made_while_sampling_is_found_without_a_heap_scan',
             "the creation watch without spawn tracking hooks nothing: the profiler finds no new greenlet"),
    Mutation('native/capture/capture.c', "            h = fnv1a(fnv1a(h, s.out[i].addr), (uint64_t)(uint32_t)s.out[i].lasti);",
             "            h = fnv1a(h, s.out[i].addr);",
             "tests/test_profile.py::test_a_parked_greenlet_s_stamp_changes_exactly_when_it_moves",
             "a parked greenlet's stamp ignores where in a function it waits: a stack captured at one line is reused at another"),
    Mutation('src/btcore/profile/sampler.py', '        self._phases = -(-rate // PARKED_RATE)', '        self._phases = 1',
             'tests/test_profile.py::test_parked_greenlets_are_looked_at_in_turns_and_get_all_the_time_sampled',
             'every parked greenlet looked at every tick: the cost the turns remove'),
    Mutation('src/btcore/profile/sampler.py', '            if bt is not None:\n                self.profile.add(bt, name, site, PARKED_STATE, pending)',
             '            if bt is not None:\n                pass',
             'tests/test_profile.py::test_wall_clock_time_of_each_waiting_greenlet_is_where_it_waits',
             'a greenlet seen running loses the time it spent parked since its last look'),
    Mutation('src/btcore/profile/sampler.py', '                self._unlooked_parked(key, stack[1], stack[2], self.profile.sampled - ran)', '                pass',
             'tests/test_profile.py::test_wall_clock_time_of_each_waiting_greenlet_is_where_it_waits',
             'a greenlet seen running is not marked counted: its next parked look counts its running time again'),
    Mutation('src/btcore/profile/sampler.py', ' and cpu == before[2] and before[1] ==', ' and before[1] ==',
             'tests/test_profile.py::test_an_idle_threads_stack_is_reused_until_it_runs_again',
             "a thread's stack of the last tick is reused after it ran: it is shown where it no longer is"),
    Mutation('src/btcore/profile/sampler.py', 'if before is not None and cpu >= 0 and cpu == before[2]', 'if False and cpu == before[2]',
             'tests/test_profile.py::test_an_idle_threads_stack_is_reused_until_it_runs_again',
             "an idle thread's stack is captured again at every tick (the profiler's cost per idle thread)"),
    Mutation('native/capture/threads.c', '<< 3 | 6u);', '<< 3 | 2u);',
             'tests/test_contracts.py::test_thread_cpu_clock_is_the_kernels_and_stands_still_while_the_thread_sleeps',
             "the process's CPU clock is read for a thread's: it moves while the thread sleeps, and no idle stack is reused"),
    Mutation('native/capture/context.c', 'if (!known_hi || addr < main_lo || addr >= known_hi)', 'if (!known_hi || addr >= known_hi)',
             'tests/test_contracts.py::test_main_stack_end_is_the_stack_mappings_end_for_its_addresses_only',
             "an address below the main thread's stack is given its end: another thread's main greenlet is read past its stack"),
    Mutation('src/btcore/profile/sampler.py', '            self._parked_rest()', '            pass',
             'tests/test_profile.py::test_parked_greenlets_are_looked_at_in_turns_and_get_all_the_time_sampled',
             'the parked greenlets\' time since their last look is lost at the end'),
    Mutation('src/btcore/profile/sampler.py', '        if known is not None and stamp is not None and known[0] == stamp:', '        if known is not None:',
             'tests/test_profile.py::test_a_greenlet_parking_in_turn_at_two_places_shows_both',
             "a parked greenlet's first stack is reused forever, wherever it parks later"),
    Mutation('src/btcore/profile/sampler.py', '    return _ADDRESS.sub("", _GREENLET_N.sub(r"\\1", name))', '    return _ADDRESS.sub("", name)',
             'tests/test_profile.py::test_on_cpu_time_goes_to_the_computing_greenlet_half_of_the_time',
             "gevent's greenlets are grouped by their number (Greenlet-3), not by the function they run"),
    Mutation('src/btcore/profile/formats.py', '_ESCAPES = (("%", "%25"), (";", "%3B"), ("\\n", "%0A"), ("\\r", "%0D"))', '_ESCAPES = (("%", "%25"), ("\\n", "%0A"), ("\\r", "%0D"))',
             'tests/test_profile.py::test_collapsed_stacks_round_trip_with_odd_names',
             "a ';' in a frame name splits it into two frames in collapsed stacks"),
    Mutation('src/btcore/profile/formats.py', '        out.append(value & 0x7F | 0x80)', '        out.append(value & 0x7F)',
             'tests/test_profile.py::test_pprof_decoded_from_the_spec_holds_the_same_times',
             'pprof varints lose their continuation bit: the file is garbage past the first value over 127'),
    Mutation('src/btcore/profile/run.py', '        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)', '        previous = signal.getsignal(signal.SIGINT)',
             'tests/test_profile.py::test_cli_ctrl_c_writes_what_was_recorded',
             'Ctrl-C kills python -m btcore profile itself: it never reports the profile the program wrote'),
    Mutation('src/btcore/profile/run.py', '    os.register_at_fork(after_in_child=lambda: _start(settings, with_pid(settings["output"], os.getpid())))', '    pass',
             'tests/test_profile.py::test_cli_a_forked_child_writes_its_own_profile',
             'a process forked by the profiled program (a gunicorn worker) is not profiled'),
    Mutation('src/btcore/views/profile.html', '    box.textContent = node.n;', '    box.innerHTML = node.n;',
             'tests/test_profile.py::test_html_flame_view_in_a_browser',
             'the flame view inserts frame names as markup: a name holding <b> (or a script) becomes an element'),
    Mutation('src/btcore/profile/run.py', '    if settings["group_by"] == "spawn":', '    if False:',
             'tests/test_profile.py::test_cli_groups_by_spawn_site_with_tracking_turned_on',
             "--group-by spawn without spawn tracking: every stack is 'spawn site unknown'"),
    Mutation('src/btcore/profile/remote.py', '        keys = [(g.address, g.start, g.stop, g.saved, g.spill is None, bytes(g.pyframes)) for g in snap.greenlets]',
             '        keys = [(g.address,) for g in snap.greenlets]',
             'tests/test_profile_remote.py::test_a_greenlet_parking_in_turn_at_two_places_shows_both',
             "the outside profiler reuses a parked greenlet's first stack forever, wherever it parks later"),
    Mutation('src/btcore/profile/remote.py', '        memory.forget()', '        pass',
             'tests/test_profile_remote.py::test_a_greenlet_parking_in_turn_at_two_places_shows_both',
             "each outside sample reads the target's memory as the first stop cached it: the stacks never change"),
    Mutation('src/btcore/profile/remote.py', '        group = self._code_groups.get(code)', '        group = None',
             'tests/test_profile_remote.py::test_on_cpu_time_goes_to_the_computing_greenlet_half_of_the_time',
             "a running stack is grouped by its thread, never by the greenlet seen parked running the same code"),
    Mutation('src/btcore/profile/remote.py', '            self._name_python(bt)', '            pass',
             'tests/test_profile_remote.py::test_cli_a_target_that_exits_mid_recording_writes_what_was_recorded',
             "Python frames are named only when the profile is written: a target that exited leaves them unnamed"),
    Mutation('src/btcore/profile/remote.py', '                    return ENDED_EXITED', '                    raise',
             'tests/test_profile_remote.py::test_cli_a_target_that_exits_mid_recording_writes_what_was_recorded',
             "a target that exits mid-recording ends the command with a traceback and no file"),
    Mutation('src/btcore/profile/remote.py', '        except KeyboardInterrupt as e:', '        except ZeroDivisionError as e:',
             'tests/test_profile_remote.py::test_cli_ctrl_c_or_sigterm_writes_what_was_recorded',
             "Ctrl-C ends python -m btcore profile PID without writing what was recorded"),
    Mutation('src/btcore/__main__.py', '    signal.signal(signal.SIGTERM, _raise_terminated)', '    pass',
             'tests/test_profile_remote.py::test_cli_ctrl_c_or_sigterm_writes_what_was_recorded',
             "SIGTERM (a supervisor's stop) kills python -m btcore profile PID: what it recorded is lost"),
    Mutation('src/btcore/profile/sampler.py', '        self._frames_of = frames_of or _local_frames', '        self._frames_of = _local_frames',
             'tests/test_profile_remote.py::test_wall_clock_time_of_each_waiting_greenlet_is_where_it_waits',
             "the outside profile names another process's addresses as this process's"),
    Mutation("native/capture/unwind.c", "if (BTC_UNLIKELY(cfa > g->hi) &&", "if (BTC_UNLIKELY(cfa > g->hi + 8) &&",
             "tests/test_contracts.py::test_plain_frames_are_read_in_place_only_inside_the_view",
             "the walker's plain path reads a frame whose CFA lies 8 bytes past the view's end in place"),
    Mutation("native/capture/capture.c", "if (f[k].eval | f[k].exact | f[k].signal ||", "if (f[k].exact | f[k].signal ||",
             "tests/test_collect.py",
             "the merge's run of plain native frames takes eval-loop frames too: their Python frames are not merged"),
    Mutation("native/capture/unwind.c", ".delta = (uintptr_t)m->spill - m->spill_lo}", ".delta = (uintptr_t)m->spill - m->spill_lo + 8}",
             "tests/test_greenlets.py",
             "the walker's plain path reads a suspended greenlet's frame from the wrong words of its heap copy"),
    Mutation("native/capture/unwind.c",
             "p->size = !plain ? PLAIN_NEVER : (uint64_t)row->cfa_off | (from_fp ? PLAIN_FROM_FP : 0);",
             "p->size = (uint64_t)row->cfa_off | (from_fp ? PLAIN_FROM_FP : 0);",
             "tests/test_cfi_tables.py::test_plain_rows_step_as_the_interpreter",
             "rows with no plain form (CFA from fp, a return address in a register) are stepped by the plain loop "
             "as CFA = sp + offset"),
    Mutation("native/capture/capture.c", "    btc_greenlet_internal_range(&w.internal_lo, &w.internal_hi);\n", "",
             "tests/test_greenlets.py",
             "the merge of this process's greenlet stacks does not know greenlet's module: its switching frames "
             "are shown and not flagged internal"),
    Mutation("native/capture/unwind.c", "row_cache_eval_ranges == eval_ranges", "true",
             "tests/test_contracts.py::test_walk_before_the_eval_loop_is_known_still_merges",
             "pcs cached by a walk made before the eval loop's ranges were found stay marked as not the eval loop"),
    Mutation("src/btcore/web.py", "                                               partial(gevent.sleep, 0.001))",
             "                                               partial(gevent.sleep, 0))",
             "tests/test_introspect.py::test_the_web_views_snapshot_pauses_let_the_loops_timers_run",
             "the web view's snapshot pauses with gevent.sleep(0): callbacks run, timers and sockets wait for the "
             "whole snapshot (10,000 greenlets: ~0.2 s of loop lag per request)"),
    Mutation("src/btcore/remote/names.py",
             "    out = \"\".join(c if c.isprintable() else c.encode(\"unicode_escape\").decode(\"ascii\") for c in text[:MAX_NAME + 1])",
             "    out = text[:MAX_NAME + 1]",
             "tests/test_remote_names.py::test_hostile_names_are_bounded_and_escaped_in_the_text_dump",
             "a greenlet name read from the target is printed raw: its line breaks forge dump lines, its escape "
             "sequences reach the terminal"),
    Mutation("src/btcore/remote/names.py", "    return out if len(out) <= MAX_NAME else out[:MAX_NAME - 3] + \"...\"",
             "    return out",
             "tests/test_remote_names.py::test_hostile_names_are_bounded_and_escaped_in_the_text_dump",
             "a greenlet name of thousands of characters from the target is printed whole in every group header"),
    Mutation("native/remote/rlabels.c",
             "    return obj && !(obj & 7) && type && rd(m, obj, w, n * sizeof *w) && w[1] == type;",
             "    return obj && !(obj & 7) && type && rd(m, obj, w, n * sizeof *w);",
             "tests/test_remote_names.py::test_corrupt_name_fields_fall_back_to_the_plain_label",
             "objects of the target are read through the layout of the type expected, whatever their type: a "
             "float taken for gevent's ident, a list for the instance dict, an int for the function's name"),
    Mutation("src/btcore/remote/names.py",
             "        named = self._string(name) or (f\"Greenlet-{ident}\" if ident >= 0 else None)",
             "        named = self._string(name)",
             "tests/test_remote_names.py::test_outside_names_are_the_in_process_names",
             "gevent's Greenlet-N is not read from outside: every Greenlet named by type and address"),
    Mutation("native/remote/rlabels.c",
             "        if (pimpl && !(pimpl & 7) && word(r->m, pimpl + S->parent_at, &parent))",
             "        if (pimpl && !(pimpl & 7) && word(r->m, pimpl + S->parent_at + 8, &parent))",
             "tests/test_remote_names.py::test_outside_parents_are_the_in_process_parents",
             "the parent is read from the word next to the one learned: a wrong tree"),
    Mutation("src/btcore/remote/names.py", "        return f\"{module}.{qualname}\" if module and qualname else self._tp_name(tp)",
             "        return self._tp_name(tp)",
             "tests/test_remote_names.py::test_outside_names_are_the_in_process_names",
             "a greenlet class made in Python is named by its bare tp_name, without its module, unlike dump_all()"),
    Mutation("native/remote/rlabels.c",
             "        r->keys[slot].field = str_is(r, key, \"name\") ? FIELD_NAME : str_is(r, key, \"_run\") ? FIELD_RUN : FIELD_OTHER;",
             "        r->keys[slot].field = str_is(r, key, \"nam\") ? FIELD_NAME : str_is(r, key, \"_run\") ? FIELD_RUN : FIELD_OTHER;",
             "tests/test_remote_names.py::test_outside_names_are_the_in_process_names",
             "the instance dict's \"name\" key is not recognised by the one-pass reader: custom names are lost"),
    Mutation("native/remote/rlabels.c",
             "        r->types[slot].gevent = inherits(r->m, r->lay, r->obj, tp, GEVENT_GREENLET) ? 1 : -1;",
             "        r->types[slot].gevent = 1;",
             "tests/test_remote_names.py::test_outside_names_are_the_in_process_names",
             "every greenlet type is taken for gevent's Greenlet: a plain greenlet is named from its instance "
             "dict's fields, not by the function its outermost frame runs"),
    Mutation("src/btcore/remote/names.py", "        if self._is_eventlet_main(outer):",
             "        if False:",
             "tests/test_remote_names.py::test_eventlet_green_threads_are_named_as_in_process",
             "eventlet's green threads are all said to run \"main\" (the function that runs theirs)"),
    Mutation("src/btcore/remote/names.py", "        spawner = spawner if spawner and self._is_greenlet(spawner) else None",
             "        spawner = spawner or None",
             "tests/test_remote_names.py::test_outside_spawners_are_the_in_process_spawners",
             "a dead spawner's weak reference (pointing at None) is given as the spawner: None's address"),
    Mutation("src/btcore/remote/names.py",
             "    plausible = all(isinstance(at, int) and 0 < at < _MAX_FIELD and not at & 7 for at in fields.values())",
             "    plausible = True",
             "tests/test_remote_names.py::test_learned_gevent_fields_are_remembered_per_build_and_checked",
             "offsets read back from the file of learned fields are used unchecked: a misaligned or non-integer "
             "one names greenlets from the wrong word (or fails the labels)"),
    Mutation("src/btcore/remote/names.py", "        words[i] = id(sentinel)", "        words[i] = id(None)",
             "tests/test_remote_names.py::test_outside_spawners_are_the_in_process_spawners",
             "the sentinel is never planted: gevent's fields are not learned, no spawner and no Greenlet-N"),
    Mutation("native/remote/robjects.c", "X(heaptype_qualname, 864, 872, 872, 880,",
             "X(heaptype_qualname, 864, 872, 864, 880,",
             "tests/test_remote_names.py::test_a_target_on_another_cpython_is_named_through_its_versions_table[3.14]",
             "the object table's 3.14 column reads a heap type's qualname 8 bytes early: a 3.14 target's greenlet "
             "classes made in Python are named by their bare tp_name",
             "built for 3.14 the static assertions refuse it; built for another version it dies in the named test"),
    Mutation("src/btcore/remote/names.py", "lib.btc_remote_pyobjects(snap.layout.version_hex, lay)",
             "lib.btc_remote_pyobjects(0x030B07F0, lay)",
             "tests/test_remote_names.py::test_a_target_on_another_cpython_is_named_through_its_versions_table[3.14]",
             "the 3.11 column serves every target, whatever its version: a 3.13+ target is "
             "read through the wrong offsets"),
    Mutation("src/btcore/remote/names.py",
             "            if name is not None and carried == ident:",
             "            if name is not None:",
             "tests/test_remote_names.py::test_hostile_thread_names_are_bounded_escaped_or_left_out",
             "a Thread in threading's _active names the thread of its key whatever ident it carries: a target "
             "makes any thread take any name"),
    Mutation("src/btcore/remote/names.py", "            return m.word(obj - lay.values_pointer_before)",
             "            return None",
             "tests/test_remote_names.py::test_outside_thread_names_are_the_in_process_names[threads]",
             "3.11's attribute values kept before an instance are not read: its threads keep their fallback names"),
    Mutation("src/btcore/remote/names.py", "        return obj + size if valid and valid[0] else None",
             "        return None",
             "tests/test_remote_names.py::test_a_target_on_another_cpython_is_named_through_its_versions_table[3.14]",
             "3.13+'s inline attribute values are not read: a 3.13+ target's threads keep their fallback names"),
    Mutation("native/remote/robjects.c", "X(interp_modules, 888, 7656, 7688, 7592,",
             "X(interp_modules, 888, 7656, 7680, 7592,",
             "tests/test_remote_names.py::test_a_target_on_another_cpython_is_named_through_its_versions_table[3.14]",
             "sys.modules is looked for in the wrong word of a 3.14 interpreter state: no thread named",
             "built for 3.14 the static assertions refuse it; built for another version it dies in the named test"),
    Mutation("native/remote/rlabels.c",
             "        digits = (size & 3) == 2 ? UINT64_MAX : (size & 3) == 1 ? 0 : size >> O->long_tag_bits;",
             "        digits = (size & 3) == 2 ? UINT64_MAX : (size & 3) == 1 ? 0 : size;",
             "tests/test_remote_names.py::test_outside_names_are_the_in_process_names",
             "3.12+'s int tag is taken for the count of digits: gevent's idents (Greenlet-N) are not read from "
             "outside", since=(3, 13)),
    # asyncio tasks from outside (native/remote/rtasks.c, btcore/remote/tasks.py)
    Mutation("native/remote/rtasks.c", "        if (loops(&watch, c)) {", "        if (0) {",
             "tests/test_remote_tasks.py::test_a_cycle_in_an_await_chain_is_cut_with_a_note",
             "an await chain that loops (a corrupt target) is walked to its bound and shown as a deep stack, no note"),
    Mutation("native/remote/rtasks.c", "(next[0] == T->resume_opcode || next[0] == T->resume_quick)",
             "next[0] == T->resume_opcode",
             "tests/test_remote_tasks.py::test_outside_tasks_equal_dump_all_inside",
             "3.11: a coroutine whose code was quickened (run 8 times) is not seen in its await: its awaited frames "
             "are lost"),
    Mutation("native/remote/rtasks.c", "                    through_future(m, T, held, a, depth);", "                    (void)held;",
             "tests/test_remote_tasks.py::test_outside_tasks_equal_dump_all_inside",
             "gather's children lose their awaiter from outside: no 'awaited by' part, not drawn under it"),
    Mutation("native/remote/rtasks.c", "                through_future(m, T, items[i], a, depth);", "                (void)items;",
             "tests/test_remote_tasks.py::test_outside_tasks_equal_dump_all_inside",
             "3.11: the task wait_for made loses its awaiter from outside (the partial's waiter is not followed)"),
    Mutation("native/remote/rtasks.c", "            *a->holder = held;", "            (void)held;",
             "tests/test_remote_tasks.py::test_outside_tasks_equal_dump_all_inside",
             "a TaskGroup's members lose their awaiter from outside: the group's method is not noted"),
    Mutation("src/btcore/remote/tasks.py", "in_method_of.get(r.holder) if r.holder in in_method_of and names.is_task_group(r.holder) else None",
             "in_method_of.get(r.holder)",
             "tests/test_remote_tasks.py::test_outside_tasks_equal_dump_all_inside",
             "a task waiting in a method of any object is taken for the awaiter of the tasks whose callback is "
             "another method of it (a TaskGroup's rule applied to every object): edges dump_all() does not draw"),
    Mutation("src/btcore/remote/tasks.py", "            tp = lo + at - 8", "            tp = lo + at",
             "tests/test_remote_tasks.py::test_tasks_are_listed_when_asyncio_is_stripped_of_its_local_symbols",
             "3.11's task types are looked for a word past their heads: the outside dump lists no tasks"),
    Mutation("src/btcore/remote/tasks.py", "        awaiting += (holder_task,)", "        pass",
             "tests/test_remote_tasks.py::test_outside_tasks_equal_dump_all_inside",
             "a TaskGroup's members are not paired with the task suspended in the group's __aexit__"),
    Mutation("native/remote/rtasks.c", "    FAMILY(0x030D0000, 96, 120, 128,", "    FAMILY(0x030D0000, 96, 120, 120,",
             "tests/test_remote_tasks.py::test_the_task_layout_is_this_versions",
             "3.13's table reads a task's name where its coroutine is", since=(3, 13)),
    Mutation("src/btcore/remote/tasks.py", '            text = f"Task-{number}" if number is not None else None',
             "            text = None",
             "tests/test_remote_tasks.py::test_outside_tasks_equal_dump_all_inside",
             "3.13+: a task never asked its name (a lazy int) is shown as 'Task', not 'Task-N'", since=(3, 13)),
    Mutation("src/btcore/remote/tasks.py", "            self._shown[obj] = shown(text) if text is not None else None",
             "            self._shown[obj] = text",
             "tests/test_remote_tasks.py::test_absurd_names_are_bounded_and_escaped",
             "a task's name from the target is printed as it is: unbounded, its control characters raw"),
    Mutation("native/remote/rtasks.c", "bool ref = type && derives(m, type, (uintptr_t[]){T->weakref_type, 0});",
             "bool ref = type == T->weakref_type;",
             "tests/test_remote_tasks.py::test_outside_tasks_equal_dump_all_inside",
             "3.11 with spawn tracking on: asyncio's WeakSet holds tracking's records (a weakref subclass), which "
             "are taken for tasks: most tasks are not listed from outside"),
    # spawn chains from outside (native/remote/rspawn.c, btcore/remote/spawn.py, remote/process.py)
    Mutation("native/remote/rspawn.c", "    c->cut = node || n == x->ellipsis;", "    c->cut = node;",
             "tests/test_hostile_dump.py::test_spawn_records_are_read_as_spawn_c_keeps_them",
             "a chain whose older generations were dropped (a tuple copy ending in Ellipsis) is not marked cut"),
    Mutation("native/remote/rspawn.c", "        c->object = field(r, x->record_object);",
             "        c->object = at;",
             "tests/test_process_dump.py::test_outside_text_equals_dump_all_inside",
             "each chain is filed under its record, not its greenlet: no spawn site is shown from outside"),
    Mutation("native/remote/rspawn.c", "    s->truncated = flag == x->true_object;", "    s->truncated = 0;",
             "tests/test_hostile_dump.py::test_spawn_records_are_read_as_spawn_c_keeps_them",
             "a site that kept only its innermost frames is not marked so"),
    Mutation("src/btcore/remote/process.py", "        if info.spawned_by is None and creator is not None:",
             "        if False:",
             "tests/test_remote_tasks.py::test_outside_tasks_equal_dump_all_inside",
             "tasks (and greenlets not gevent's) are not drawn under the task or greenlet that created them"),
    Mutation("src/btcore/remote/process.py", "        made = creators[address] = _Creator(entry.get(address) or _running_main(address, spawner))",
             "        made = creators[address] = _Creator(entry.get(address))",
             "tests/test_process_dump.py::test_outside_text_equals_dump_all_inside",
             "a creator running as its thread's main greenlet is named by its repr, not as dump_all names it"),
    Mutation("src/btcore/remote/snapshot.py", "    room.finish()\n    spawn_chains(target, room, threads_only)\n",
             "    room.finish()\n",
             "tests/test_process_dump.py::test_outside_text_equals_dump_all_inside",
             "a live target's spawn records are not read after its stop: no spawn site is shown"),
    Mutation("native/capture/spawn.c", "0 : !memo_newer[set];", "0 : memo_newer[set];",
             "tests/test_spawn.py::test_two_places_of_one_memo_set_keep_a_proof_each",
             "a place new to its set takes the way used last: two places of one set evict each other, every spawn walks"),
    Mutation("native/capture/spawn.c",
             "    spawn_parts parts = {0};\n    if (enabled && !in_hook) {\n        /* The walk starts here",
             "    spawn_parts parts = {0};\n    PyObject *made = original_new(type, args, kwds);\n"
             "    if (made && enabled && !in_hook) {\n        /* The walk starts here",
             "tests/test_spawn.py::test_a_dump_run_by_the_spawners_repr_sees_no_half_made_greenlet",
             "the spawner's repr (Python code) runs after greenlet's tp_new, while a subclass's greenlet is half "
             "made: a dump then reads its NULL fields (SIGSEGV)",
             note="the mutant makes a greenlet, left half made, before the parts are taken, then the one it returns"),
    Mutation("native/capture/spawn.c", "    int collecting = PyGC_Disable();\n    if (note)",
             "    int collecting = 0;\n    if (note)",
             "tests/test_spawn.py::test_a_dump_run_by_a_collection_while_recording_sees_no_half_made_greenlet",
             "a collection set off by the record's allocation runs gc.callbacks while the greenlet is half made"),
    Mutation("src/btcore/remote/process.py", "    spawn_chains(target, Room(), threads_only)\n", "",
             "tests/test_remote_tasks.py::test_tasks_of_a_core_file_equal_the_live_ones",
             "a core file's spawn records are not read: no spawn site is shown"),
]

BUILD_HERE = False   # set by main(): can_build_here()
BUILD_ENV = dict(os.environ, BTCORE_LTO="0")   # main() adds the compiler cache
IGNORED = shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache")


def stale(m: Mutation, text: str) -> str | None:
    """Why m cannot be applied to its file's text, or None (tests/test_mutation_list.py asks it too)."""
    found = text.count(m.original)
    return None if found == 1 else f"original text found {found} times (must be exactly once)"


def apply(copy: str, m: Mutation) -> str | None:
    """Write the mutant into the copy; None, or why it cannot be applied."""
    path = os.path.join(copy, m.path)
    with open(os.path.join(ROOT, m.path)) as f:
        text = f.read()
    why = stale(m, text)
    if why:
        return why
    with open(path, "w") as f:
        f.write(text.replace(m.original, m.replacement))
    return None


def restore(copy: str, m: Mutation) -> None:
    shutil.copyfile(os.path.join(ROOT, m.path), os.path.join(copy, m.path))


def can_build_here() -> bool:
    """Can pip build a wheel with this environment's own setuptools (no
    isolated build environment for the baseline: ~7 s instead of ~20 s)?"""
    done = subprocess.run([sys.executable, "-c", "import setuptools.command.bdist_wheel"], capture_output=True)
    if done.returncode == 0:
        return True
    return subprocess.run([sys.executable, "-c", "import wheel.bdist_wheel"], capture_output=True).returncode == 0


def build(copy: str, target: str) -> str | None:
    """The unmutated checkout installed into target, as pip installs it."""
    # A fresh build every time: setuptools does not see header changes, so
    # an incremental build could install the previous mutant.
    shutil.rmtree(os.path.join(copy, "build"), ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    isolation = ["--no-build-isolation"] if BUILD_HERE else []
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *isolation,
                           "--target", target, "."], cwd=copy, capture_output=True, text=True, env=BUILD_ENV)
    return None if done.returncode == 0 else done.stderr[-2000:]


CORE = ("native/", "src/btcore/_build.py")   # what build_core() compiles
# The core compiled alone by its own builder (src/btcore/_build.py), as pip's
# build runs it, into the copy's root (its sources are named from there).
COMPILE_CORE = """
import importlib.util
spec = importlib.util.spec_from_file_location("_build", "src/btcore/_build.py")
builder = importlib.util.module_from_spec(spec)
spec.loader.exec_module(builder)
print(builder.ffibuilder.compile(tmpdir="."))
"""


def build_core(copy: str, target: str) -> str | None:
    """A mutant of the core (native/) put into the installed baseline: the
    extension compiled alone and put in place of the baseline's (the rest
    of the package is the baseline's, unchanged).  pip's wheel around the
    same compile took 5.3 s a mutant here, this 2.6 s."""
    out = os.path.join(copy, "btcore")
    # No output left from the previous mutant: distutils would take it for up to date after a change of a
    # header only (ccache, which hashes the headers each unit includes, compiles what changed).
    shutil.rmtree(out, ignore_errors=True)
    # (-D_CFFI_NO_LIMITED_API: what setuptools' cffi hook adds for a module not on the limited API)
    env = dict(BUILD_ENV, CFLAGS=(BUILD_ENV.get("CFLAGS", "") + " -D_CFFI_NO_LIMITED_API").strip())
    done = subprocess.run([sys.executable, "-c", COMPILE_CORE], cwd=copy, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return done.stderr[-2000:]
    built = done.stdout.strip().splitlines()[-1]
    installed = os.path.join(target, "btcore", os.path.basename(built))
    if not os.path.exists(installed):
        return f"the baseline has no {installed} to replace with {built}"
    os.replace(built, installed)
    shutil.rmtree(out, ignore_errors=True)
    return None


def installed_core(target: str) -> str:
    """The path of the core's extension in an installed target."""
    found = glob.glob(os.path.join(target, "btcore", "_native*.so"))
    if len(found) != 1:
        raise RuntimeError(f"{len(found)} core extensions installed in {target}: {found}")
    return found[0]


def compiler_cache(cache_dir: str) -> str | None:
    """Build through ccache (apt-get installs it where root may): None, or why not."""
    if shutil.which("ccache") is None:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            return "ccache missing (apt-get needs root)"
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        # (waiting for dpkg's lock: the arm64 lane's apt-get may hold it on the host; refused at once, every
        # mutant was compiled whole, twice as slow)
        wait = ["-o", "DPkg::Lock::Timeout=600"]
        for cmd in (["apt-get", *wait, "update", "-q"], ["apt-get", *wait, "install", "-y", "-q", "ccache"]):
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
            if done.returncode:
                return f"{' '.join(cmd)} failed: {(done.stderr.strip().splitlines() or [''])[-1]}"
    BUILD_ENV.update(CC=f"ccache {os.environ.get('CC', 'gcc')}", CCACHE_DIR=cache_dir)
    return None


def pytest_failure(copy: str, target: str, args: list, timeout: float) -> str | None:
    """None when pytest passes; else what failed (its summary's last lines), so
    that a failing baseline names the test, not only the list it ran."""
    env = dict(os.environ, PYTHONPATH=target + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *args],
                              cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"no end within {timeout:.0f} s"   # a hang is caught too: the suite would never finish
    if done.returncode == 0:
        return None
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
    return tail or f"pytest exited with {done.returncode}, printing nothing"   # never "": that reads as a pass


PACKAGE = "src/btcore/"


def installed_as_is(m: Mutation) -> bool:
    """A file the build copies unchanged into the package (its .py modules
    and views/page.html; not _build.py, which builds the core): its mutant needs
    no build, only the file put into the installed baseline."""
    return m.path.startswith(PACKAGE) and not m.path.endswith("_build.py")


def install_file(copy: str, target: str, path: str) -> None:
    installed = os.path.join(target, "btcore", path[len(PACKAGE):])
    shutil.copyfile(os.path.join(copy, path), installed)
    # A cached .pyc is trusted on (mtime in seconds, size): a mutant and its
    # restore within one second, of one size, would run the stale bytecode.
    shutil.rmtree(os.path.join(os.path.dirname(installed), "__pycache__"), ignore_errors=True)


class Workspace(NamedTuple):
    """One worker's own files: a copy of the checkout (mutated one mutant at
    a time), the baseline installed into target, and that baseline's
    extension kept aside, put back after each mutant of the core."""
    copy: str
    target: str
    core: str


def make_workspace(scratch: str, number: int) -> tuple[Workspace, str | None]:
    """A worker's copy of the checkout, with the baseline built and
    installed: (the workspace, None), or (it, why it does not build)."""
    root = os.path.join(scratch, f"worker{number}")
    ws = Workspace(os.path.join(root, "src"), os.path.join(root, "site"), os.path.join(root, "baseline-core.so"))
    shutil.copytree(ROOT, ws.copy, ignore=IGNORED)
    problem = build(ws.copy, ws.target)
    if problem is None:
        shutil.copyfile(installed_core(ws.target), ws.core)
    return ws, problem


def run_one(ws: Workspace, m: Mutation, timeout: float) -> str:
    problem = apply(ws.copy, m)
    if problem:
        return "ERROR: " + problem
    try:
        if installed_as_is(m):
            install_file(ws.copy, ws.target, m.path)
        else:
            problem = build_core(ws.copy, ws.target) if m.path.startswith(CORE) else build(ws.copy, ws.target)
        if problem:
            return "ERROR: mutant does not build:\n" + problem
        if pytest_failure(ws.copy, ws.target, [m.killer], timeout):
            return "killed"
        # (not the test of this list, which fails on every mutant: it finds the mutated text, not the original)
        other = pytest_failure(ws.copy, ws.target, ["--ignore=tests/test_mutation_list.py"], timeout)
        if other:   # with what failed: the named killer is then to be corrected
            return "killed (by another test than the named one)\n" + other
        return "SURVIVED"
    finally:
        # The worker's baseline as it was, whatever the next mutant is.
        restore(ws.copy, m)
        if installed_as_is(m):
            install_file(ws.copy, ws.target, m.path)
        elif m.path.startswith(CORE):
            shutil.copyfile(ws.core, installed_core(ws.target))
        else:   # (setup.py, pyproject.toml) the whole install was the mutant's
            build(ws.copy, ws.target)


def baseline_problem(ws: Workspace, chosen: list, timeout: float) -> str | None:
    """The unmutated product must pass every named killer test, else a
    'killed' verdict would mean nothing."""
    killers = sorted({m.killer for m in chosen})
    failure = pytest_failure(ws.copy, ws.target, killers, timeout)
    if failure is None:
        return None
    # Once more before giving up: this lane runs beside the sid and arm64 lanes, and a timing test that
    # failed under their load would otherwise hide every mutant's verdict.  Said loudly either way.
    print("WARNING: the unmutated checkout failed a killer test, run again:\n" + failure, flush=True)
    again = pytest_failure(ws.copy, ws.target, killers, timeout)
    return None if again is None else "the unmutated checkout fails a killer test twice:\n" + again


def run_all(workspaces: list, chosen: list, timeout: float) -> int:
    """Every chosen mutant run by the first free worker, its verdict printed
    as it comes; the number that were not killed."""
    todo = queue.SimpleQueue()
    for m in chosen:
        todo.put(m)
    printing = threading.Lock()
    failures = []

    def work(ws: Workspace) -> None:
        while True:
            try:
                m = todo.get_nowait()
            except queue.Empty:
                return
            t0 = time.monotonic()
            try:
                verdict = run_one(ws, m, timeout)
            except Exception as e:   # (the worker's files): said as this mutant's error, the others go on
                verdict = f"ERROR: {type(e).__name__}: {e}"
            note = f"  [{m.note}]" if m.note else ""
            with printing:
                if not verdict.startswith("killed"):
                    failures.append(m)
                print(f"{verdict.splitlines()[0]:<12} {time.monotonic() - t0:5.0f}s  {m.path}: {m.breaks}{note}",
                      flush=True)
                if "\n" in verdict:
                    print(verdict, flush=True)

    threads = [threading.Thread(target=work, args=(ws,)) for ws in workspaces]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(failures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[],
                        help="run the mutations whose file or text contains this (repeatable: any of them)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per pytest run")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                        help="mutants run at once, each by its own worker (default: one per CPU)")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    chosen = [m for m in MUTATIONS if not args.only or any(o in m.path or o in m.original for o in args.only)]
    later = [m for m in chosen if sys.version_info[:2] < m.since]
    for m in later:
        print(f"not run here (code of CPython {'.'.join(map(str, m.since))}+): {m.path}: {m.breaks}")
    chosen = [m for m in chosen if m not in later]
    if not chosen:   # (the baseline would run the whole suite for nothing)
        if later:
            return 0
        print(f"ERROR: no mutation's file or text contains {args.only!r}")
        return 2
    global BUILD_HERE
    BUILD_HERE = can_build_here()
    if not BUILD_HERE:
        print("note: no bdist_wheel here (pip install wheel): building the baseline in an isolated environment")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="btcore-mutations-") as scratch:
        no_cache = compiler_cache(os.path.join(scratch, "ccache"))
        if no_cache:
            print(f"note: {no_cache}: each mutant of the core is compiled whole")
        jobs = min(args.jobs, len(chosen))
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            made = list(pool.map(make_workspace, [scratch] * jobs, range(jobs)))
        problem = next((p for _, p in made if p), None)
        if problem:
            print("ERROR: the unmutated checkout does not build:\n" + problem)
            return 1
        workspaces = [ws for ws, _ in made]
        baseline = baseline_problem(workspaces[0], chosen, args.timeout)
        if baseline:
            print("ERROR: " + baseline)
            return 1
        print(f"{len(chosen)} mutants, {jobs} at a time", flush=True)
        failures = run_all(workspaces, chosen, args.timeout)
    print(f"{len(chosen) - failures}/{len(chosen)} killed in {time.monotonic() - start:.0f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
