"""A torch tensor changed after plan() or emit() never crashes the process.

torch, unlike numpy, lets a tensor's bytes be freed while others hold the
tensor: ``resize_`` to a larger size reallocates its storage, ``set_``
points it at another one. ``write`` then refuses a reallocated tensor with
FormatError (``invalid_argument``) instead of reading freed memory, a
``set_`` tensor is written as planned (the plan holds its old storage), and
``emit`` copies every tensor whose bytes torch may reallocate, so the
consumer gets the values as they were at ``emit``.

Each case runs in a child process: a crash (SIGSEGV) shows as a failed test
with the child's output, not as the end of pytest.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


# 4 MiB: above the default copy threshold (64 KiB), and large enough that
# the allocator maps it on its own, so freed bytes are unmapped at once.
BIG = 1 << 20

CHILD_PRELUDE = f"""\
import gc, numpy as np, torch, blobpipe as bf

def planned():  # a BIG float32 tensor and its plan
    t = torch.arange({BIG}, dtype=torch.float32)
    return t, bf.plan(["x"], [t])

def written(p):  # write(p) into a fresh buffer; its first entry's value
    buf = np.zeros(p.nbytes, dtype=np.uint8)
    bf.write(p, buf)
    e = bf.read_index(buf)[0]
    return bf.decode_entry(memoryview(buf)[e.off : e.off + e.len], e)
"""


def run_child(body: str) -> str:
    """Runs ``body`` (after CHILD_PRELUDE) in a fresh interpreter; fails
    the test unless it exits 0. Returns its stdout."""
    code = CHILD_PRELUDE + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (f"child exited {r.returncode}\n--- stdout\n{r.stdout}"
                               f"\n--- stderr\n{r.stderr}")
    return r.stdout



@pytest.mark.parametrize("strided", [False, True])
def test_write_refuses_a_tensor_resized_after_plan(strided):
    out = run_child(f"""
        t = torch.arange({BIG}, dtype=torch.float32)
        v = t.view(1024, -1).t() if {strided} else t
        p = bf.plan(["x"], [v])
        t.resize_({BIG * 16})          # reallocates the storage: the planned bytes are freed
        gc.collect()
        try:
            bf.write(p, bytearray(p.nbytes))
        except bf.FormatError as e:
            assert e.category == "invalid_argument", e.category
            assert "'x'" in str(e) and "plan it again" in str(e), str(e)
            print("refused")
    """)
    assert "refused" in out


def test_write_of_a_tensor_set_to_other_storage_writes_the_planned_bytes():
    out = run_child(f"""
        t, p = planned()
        want = t.clone()
        t.set_(torch.zeros(3))         # the old storage's last user is the plan
        del t
        gc.collect()
        assert torch.equal(written(p), want)
        print("written")
    """)
    assert "written" in out


def test_write_tail_after_resize_needs_no_tensor_bytes():
    out = run_child(f"""
        t, p = planned()
        t.resize_({BIG * 16})
        tail = bytearray(p.nbytes - p.index_off)
        bf.write_tail(p, tail)         # index and footer only: nothing of t is read
        assert bf.footer_is_valid(tail)
        print("tail")
    """)
    assert "tail" in out


def test_a_tensor_resized_after_plan_back_within_its_storage_is_written():
    # resize_ to a smaller size keeps the storage: its bytes are still there.
    out = run_child(f"""
        t, p = planned()
        t.resize_(10)
        assert torch.equal(written(p), torch.arange({BIG}, dtype=torch.float32))
        print("written")
    """)
    assert "written" in out


@pytest.mark.parametrize("n, change", [
    (16, "resize"),          # 64 B: copied at emit, as every small value
    (BIG, "resize"),         # 4 MiB, torch-owned memory: copied at emit too
    (BIG, "set"),
    (BIG, "resize_storage"),
])
def test_emit_then_change_delivers_the_emitted_values(n, change):
    out = run_child(f"""
        sender, consumer = bf.loopback_pair()
        t = torch.arange({n}, dtype=torch.float32)
        want = t.clone()
        with sender:
            blob = sender.open_blob()
            blob.emit("x", t)
            if "{change}" == "resize":
                t.resize_({n} * 16)
            elif "{change}" == "set":
                t.set_(torch.zeros(3))
            else:
                t._storage().resize_(0) if hasattr(t, "_storage") else t.untyped_storage().resize_(0)
            del t
            gc.collect()
            blob.finish()
        got = [ev for ev in consumer if isinstance(ev, bf.EntryReady)]
        assert len(got) == 1 and torch.equal(got[0].value, want)
        consumer.close()
        print("delivered")
    """)
    assert "delivered" in out


def test_emit_of_a_large_tensor_over_numpy_memory_delivers_its_values():
    # torch.from_numpy: a storage torch may not resize (sent without a copy
    # where torch can say so, from torch 2); the resize is torch's error,
    # and the consumer gets the values.
    out = run_child(f"""
        a = np.arange({BIG}, dtype=np.float32)
        t = torch.from_numpy(a)
        sender, consumer = bf.loopback_pair()
        with sender:
            blob = sender.open_blob()
            blob.emit("x", t)
            try:
                t.resize_({BIG} * 16)
            except RuntimeError as e:
                assert "not resizable" in str(e), str(e)
            blob.finish()
        got = [ev for ev in consumer if isinstance(ev, bf.EntryReady)]
        assert len(got) == 1 and np.array_equal(got[0].value.numpy(), a)
        consumer.close()
        print("delivered")
    """)
    assert "delivered" in out


# numpy refuses to resize an array others hold only by its reference
# count, which resize(refcheck=False) skips: the bytes could be reallocated
# under a plan or an emit, and write_entry would read freed memory (a
# SIGSEGV). blobpipe holds a weak reference to the array that owns the
# bytes while it may read them, which numpy's resize refuses even with
# refcheck=False: the caller's resize raises, blobpipe never refuses the
# array, and the planned values are written.
@pytest.mark.parametrize("view", [False, True])
def test_numpy_array_under_a_plan_cannot_be_resized_away(view):
    out = run_child(f"""
        a = np.arange({BIG}, dtype=np.float32)
        want = a.copy()
        v = a[::-1] if {view} else a     # a view: its owner is held
        p = bf.plan(["x"], [v])
        try:
            a.resize({BIG} * 16, refcheck=False)
            print("resized")
        except ValueError as e:
            assert "referenced" in str(e), str(e)
        got = written(p)
        assert np.array_equal(got, want[::-1] if {view} else want), got[:4]
        del p, got
        gc.collect()
        a.resize({BIG} * 16, refcheck=False)   # the plan is gone: held no longer
        print("written")
    """)
    assert "resized" not in out
    assert "written" in out


def test_numpy_array_under_a_callers_plan_cannot_be_resized_away():
    # Assigning a field makes the plan a caller's plan, written from its
    # fields: its buffers still view the array, so the guard must stay.
    out = run_child(f"""
        a = np.arange({BIG}, dtype=np.float32)
        want = a.copy()
        p = bf.plan(["x"], [a])
        p.tag = b"a caller's plan"
        try:
            a.resize({BIG} * 16, refcheck=False)
            print("resized")
        except ValueError as e:
            assert "referenced" in str(e), str(e)
        got = written(p)
        assert np.array_equal(got, want), got[:4]
        print("written")
    """)
    assert "resized" not in out
    assert "written" in out


def test_a_numpy_destination_cannot_be_resized_away_during_write():
    # write() copies into `out` without the GIL. A tensor subclass whose
    # storage's data_ptr() (which write() asks, with the GIL, right before
    # the copy) resizes the destination stands in for another thread doing
    # it then: numpy must refuse (a buffer export does not stop it), or the
    # copy writes freed memory.
    out = run_child(f"""
        class Hook:
            def __init__(self, s): self.s = s
            def data_ptr(self):
                print("asked", flush=True)
                try:
                    dest.resize(dest.size * 16, refcheck=False)
                    print("resized")
                except ValueError as e:
                    assert "referenced" in str(e), str(e)
                return self.s.data_ptr()
            def nbytes(self): return self.s.nbytes()
        class Sneaky(torch.Tensor):  # write() holds and asks the untyped storage
            __torch_function__ = torch._C._disabled_torch_function_impl
            def _storage(self): return Hook(super()._storage())
            def untyped_storage(self): return Hook(super().untyped_storage())
        t = torch.arange({BIG}, dtype=torch.float32).as_subclass(Sneaky)
        p = bf.plan(["x"], [t])
        dest = np.zeros(p.nbytes, dtype=np.uint8)
        for target in (dest, memoryview(dest)):
            bf.write(p, target)
        e = bf.read_index(dest)[0]
        got = bf.decode_entry(memoryview(dest)[e.off : e.off + e.len], e)
        assert torch.equal(got, torch.arange({BIG}, dtype=torch.float32)), got[:4]
        print("written")
    """)
    assert "asked" in out  # the hook ran
    assert "resized" not in out
    assert "written" in out


def test_numpy_array_under_an_emit_cannot_be_resized_away():
    out = run_child(f"""
        a = np.arange({BIG}, dtype=np.float32)
        want = a.copy()
        sender, consumer = bf.loopback_pair()
        with sender:
            blob = sender.open_blob()
            blob.emit("x", a)
            try:
                a.resize({BIG} * 16, refcheck=False)
                print("resized")
            except ValueError as e:
                assert "referenced" in str(e), str(e)
            blob.finish()
        got = [ev for ev in consumer if isinstance(ev, bf.EntryReady)]
        assert len(got) == 1 and np.array_equal(np.asarray(got[0].value), want)
        consumer.close()
        print("delivered")
    """)
    assert "resized" not in out
    assert "delivered" in out
