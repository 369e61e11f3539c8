"""Where a run's dataset is: ``--dataset-file``, else the config's ``experiment.dataset``.

A name with a suffix is a workspace path (or a file in ``data/``); a bare name is
``data/<name>`` with one of :data:`DATASET_SUFFIXES`, tried in that order.
"""

from __future__ import annotations

from pathlib import Path

from osmosis_ai.errors import ConfigError

DATASET_SUFFIXES = (".jsonl", ".csv", ".parquet")
"""The dataset file formats a run reads, in the order a bare name tries them."""


class DatasetError(ConfigError):
    """A dataset file or one of its rows cannot be used; the message names the row."""

    def __init__(
        self, message: str, *, path: Path | None = None, row_index: int | None = None
    ) -> None:
        self.path = path
        self.row_index = row_index
        super().__init__(f"{path}: {message}" if path is not None else message)


def resolve_dataset(
    name: str, *, root: Path, data_dir: Path, dataset_file: Path | None, cwd: Path
) -> tuple[Path, str]:
    """The dataset's resolved path and its name (the stem of the file as it was named).

    ``dataset_file`` (relative to ``cwd``) wins over ``name``; ``root`` is the workspace and
    ``data_dir`` its ``data/`` folder. Raises :class:`DatasetError` naming every place looked.
    """
    if dataset_file is not None:
        path = (cwd / dataset_file.expanduser()).resolve()
        if not path.is_file():
            raise DatasetError(f"--dataset-file {dataset_file}: file not found ({path})")
        return path, path.stem
    if name.endswith(DATASET_SUFFIXES):
        candidates = [root / name, data_dir / name]
    else:
        candidates = [data_dir / f"{name}{suffix}" for suffix in DATASET_SUFFIXES]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve(), candidate.stem
    looked = ", ".join(str(c.relative_to(root)) for c in candidates)
    raise DatasetError(
        f"dataset {name!r} (experiment.dataset) was not found in the workspace: looked for "
        f"{looked}. Put the file there, or pass --dataset-file PATH"
    )
