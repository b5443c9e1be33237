"""Issue 44: ``gsd rank`` with a private folder given as its own public folder hung 240 s (twice in a
sweep; a clean error in 3 s on every rerun). Not reproduced (dozens of runs, alone and nine at a time):
the refusal runs before any image is decoded and starts no thread (checked here), so it is run under a
timeout that prints every thread's stack should it ever hang again. The suspected decoding pools did
hold a hang: an iterator closed from one of their own threads (the garbage collector finalising a
dropped one there) joined the input thread, which was waiting for that very thread's image."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from gsd_cli.data import loader, resolve

#: runs gsd under faulthandler: past the limit it prints every thread's stack and exits (the test then fails with them)
WATCHED = ("import faulthandler, sys; faulthandler.dump_traceback_later({limit}, exit=True); "
           "from gsd_cli.cli import main; sys.exit(main(sys.argv[1:]))")
LIMIT = 90


def _gsd(*argv):
    return subprocess.run([sys.executable, "-c", WATCHED.format(limit=LIMIT), *map(str, argv)], capture_output=True, text=True,
                          timeout=LIMIT + 30, env={**os.environ, "COLUMNS": "200"})


@pytest.mark.parametrize("public, dp", [("folder:{root}", False), ("folder:{root}/", False), ("folder:{link}", False),
                                        ("folder:{root}", True)])
def test_a_private_folder_given_as_its_public_folder_is_refused_in_time(image_folder, tmp_path, public, dp):
    link = tmp_path / "link"
    link.symlink_to(image_folder)
    argv = ["rank", "--private", f"folder:{image_folder}", "--public", public.format(root=image_folder, link=link),
            "-m", "8", "-k", "2", "--model", "fmnist-cnn", "-q"]
    if dp:
        argv += ["--dp", "--epsilon", "1", "--classes", "2"]
    r = _gsd(*argv)
    assert "Fatal Python error" not in r.stderr and "Timeout" not in r.stderr, r.stderr  # faulthandler: a hang, with its stacks
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and lines[-1].startswith("error: public candidate") and "is private data" in lines[-1], r.stderr


def test_the_refusal_starts_no_thread(image_folder, monkeypatch, capsys):
    from gsd_cli.cli import main

    started = []
    real = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (started.append(self.name), real(self))[1])
    code = main(["rank", "--private", f"folder:{image_folder}", "--public", f"folder:{image_folder}", "-m", "8", "-k", "2",
                 "--model", "fmnist-cnn", "-q"])
    assert code == 2 and "is private data" in capsys.readouterr().err
    assert started == []


def test_closing_the_input_pipeline_from_its_own_decoding_thread_does_not_hang(image_folder, monkeypatch):
    """The garbage collector may finalise a dropped iterator in a decoding thread: closing it there must
    not wait for the input thread (which waits for this thread's image). Hung before the fix."""
    src = resolve(f"folder:{image_folder}")
    gen = loader.model_batches(src, list(range(len(src))), 8, 1, 2, "cpu", ahead=1, workers=2)
    suspended, closed = threading.Event(), []
    real = loader.read_images

    def read(source, indices, size=None):
        if threading.current_thread().name.startswith("gsd-decode") and not closed and suspended.wait(10):
            closed.append(threading.current_thread().name)
            gen.close()  # as the garbage collector would, in this thread
        return real(source, indices, size)

    monkeypatch.setattr(loader, "read_images", read)

    def consume():
        next(gen)  # chunk 0; chunk 1 is being decoded by the pool
        suspended.set()

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    t.join(30)
    waiting = ["?"]
    for _ in range(60):  # the pipeline's threads end on their own (before the fix: never)
        time.sleep(0.5)
        waiting = [th.name for th in threading.enumerate() if th.name.startswith(loader.THREAD_PREFIXES)]
        if not waiting:
            break
    assert closed and not t.is_alive()
    assert waiting == [], f"threads still waiting: {waiting}"
