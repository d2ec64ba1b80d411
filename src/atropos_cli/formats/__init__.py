"""The file formats of scored groups and datasets, each with its writer and reader: `jsonl`, `parquet`, `html`
(the viewer), `dataset` (SFT/DPO datasets), `reader` (paths, globs and run dirs -> a stream of groups), `text`
(how a message becomes plain text). Nothing here talks to a server or a model."""
