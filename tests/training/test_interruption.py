"""kbert.training.interruption: SIGTERM and SIGINT sent by another process, the exit status a
shell expects (128 + the signal), the checkpoint-write error line, and the random states a
checkpoint must keep."""

import signal
import subprocess
import sys
import threading

import pytest

from kbert.backend.checkpoints import checkpoint_write_failed, random_state_variables
from kbert.runtime.errors import KbertError, command_line_names
from kbert.training.interruption import StopSignals

SECOND_SIGNAL = """
import os, signal, sys, time
from kbert.training.interruption import StopSignals
with StopSignals() as signals:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    assert signals.requested == signal.SIGTERM
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
print("not reached")
"""


def test_the_second_signal_exits_at_once_with_its_status():
    result = subprocess.run([sys.executable, "-c", SECOND_SIGNAL], capture_output=True, text=True, timeout=60)
    assert result.returncode == 143 and "not reached" not in result.stdout
    assert result.stderr.strip().splitlines() == [
        "kbert: SIGTERM received: saving a checkpoint after the step in flight (send it again to stop at once)",
        "kbert: second SIGTERM: stopped at once; the last saved checkpoint is intact",
    ]


# A training loop in miniature: steps until a stop is requested, then what the loop raises; after
# the `with`, a second signal (as one sent while the run writes its last files).
LOOP = """
import os, signal, sys, time
from kbert.training.interruption import StopSignals
with StopSignals() as signals:
    print("ready", flush=True)
    deadline = time.monotonic() + 30
    while signals.requested is None and time.monotonic() < deadline:
        time.sleep(0.01)
    error = signals.interrupted(7, "checkpoint saved", "`kbert pretrain --resume`")
print(signals.requested, error.exit_code, error, sep="\\n", flush=True)
os.kill(os.getpid(), signals.requested)
time.sleep(5)
print("not reached")
"""


@pytest.mark.parametrize("number, name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")])
def test_a_signal_from_another_process_stops_the_loop_after_its_step(number, name):
    process = subprocess.Popen([sys.executable, "-c", LOOP], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "ready\n"
        process.send_signal(number)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    # SIGINT too is only recorded (no KeyboardInterrupt mid-step); the loop ends on its own.
    assert stdout.splitlines() == [
        str(int(number)),
        str(128 + number),
        "interrupted at step 7: checkpoint saved; continue with `kbert pretrain --resume`",
    ]
    # The handlers outlive the `with` once a stop was asked for: the second signal exits at once.
    assert process.returncode == 128 + number  # 143 for SIGTERM, 130 for SIGINT
    assert stderr.splitlines() == [
        f"kbert: {name} received: saving a checkpoint after the step in flight (send it again to stop at once)",
        f"kbert: second {name}: stopped at once; the last saved checkpoint is intact",
    ]


def test_without_a_signal_the_previous_handlers_come_back():
    before = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    with StopSignals() as signals:
        inside = {number: signal.getsignal(number) for number in before}
    assert inside == dict.fromkeys(before, signals._handle)
    assert {number: signal.getsignal(number) for number in before} == before
    assert signals.requested is None


def test_outside_the_main_thread_it_does_nothing():
    # Python installs signal handlers only from the main thread; training in another thread
    # (a notebook's worker, a test runner's) must still run.
    before = signal.getsignal(signal.SIGTERM)
    seen = []

    def train():
        with StopSignals() as signals:
            seen.append((signal.getsignal(signal.SIGTERM), signals.requested))

    thread = threading.Thread(target=train)
    thread.start()
    thread.join()
    assert seen == [(before, None)]


def test_interrupted_carries_the_signals_exit_status():
    signals = StopSignals()
    signals.requested = signal.SIGINT
    error = signals.interrupted(12, "checkpoint saved in out.partial", "`kbert finetune ... --resume`")
    assert error.exit_code == 130
    assert str(error) == (
        "interrupted at step 12: checkpoint saved in out.partial; continue with `kbert finetune ... --resume`"
    )


@pytest.mark.parametrize(
    "previous, said",
    [
        (4, "the previous checkpoint (step 4) is intact: fix the cause, then --resume"),
        (None, "no checkpoint was saved: fix the cause, then run again"),
        (0, "no checkpoint was saved: fix the cause, then run again"),  # a new run, before its first
    ],
)
def test_a_failed_checkpoint_write_says_what_is_left(previous, said):
    with command_line_names({"--resume"}):  # as `kbert pretrain` and `kbert finetune` run it
        error = checkpoint_write_failed(8, previous, OSError(28, "No space left on device"))
    assert isinstance(error, KbertError)
    assert str(error) == f"writing the checkpoint for step 8 failed ([Errno 28] No space left on device); {said}"


def test_a_failed_checkpoint_write_tells_a_python_caller_its_argument():
    error = checkpoint_write_failed(8, 4, OSError(28, "No space left on device"))
    assert str(error).endswith("the previous checkpoint (step 4) is intact: fix the cause, then resume=True"), error


def test_a_failed_checkpoint_write_names_the_folder_and_the_cause():
    # TensorFlow's own words for a full disk under SaveV2, naming its temporary shard.
    error = RuntimeError(
        "run/checkpoints/ckpt-8_temp/part-00000-of-00001.data-00000-of-00001.tempstate7; No space left on device"
    )
    with command_line_names({"--resume"}):
        said = str(checkpoint_write_failed(8, 4, error))
    assert said == (
        "writing the checkpoint for step 8 failed: run/checkpoints: no space left on device; the previous "
        "checkpoint (step 4) is intact: free some space there (or choose a path on another disk), then --resume"
    )


def test_random_states_are_the_seed_generators_and_nothing_else():
    import keras

    inputs = keras.Input((4,))
    dropout = keras.layers.Dropout(0.1, seed=1)
    model = keras.Model(inputs, dropout(keras.layers.Dense(3)(inputs)))
    states = random_state_variables(model)
    assert [v.path for v in states] == [dropout.seed_generator.state.path]
    assert not {v.path for v in states} & {w.path for w in model.weights}
    without_dropout = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    assert random_state_variables(without_dropout) == []
