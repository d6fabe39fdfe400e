"""A callback for the resume tests: the fit's own process receives a real signal once a given training step ended."""
import os
import signal

import lightning as L


class SignalAt(L.Callback):
    """Sends this process ``signal_name`` (SIGTERM, SIGKILL) once training step ``step`` has ended."""

    def __init__(self, step: int, signal_name: str = "SIGTERM"):
        self.step, self.signal = step, getattr(signal, signal_name)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signal)
