"""What happens to a trial folder after its trial: secrets scrubbed from every file, then
its logs and artifacts moved under the rollout's artifact folder."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

REDACTED = "<redacted>"


def scrub_secrets(root: Path, secrets: list[str]) -> int:
    """Replace every secret in every file under ``root`` (text or binary) with
    ``<redacted>``; the number of files changed. Symlinks are left alone."""
    needles = sorted({s.encode() for s in secrets if s and len(s) >= 4}, key=len, reverse=True)
    if not needles or not root.exists():
        return 0
    changed = 0
    for current, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            path = Path(current) / name
            if path.is_symlink() or not path.is_file():
                continue
            try:
                data = path.read_bytes()
            except OSError as exc:
                logger.warning("cannot read %s to scrub it: %s", path, exc)
                continue
            scrubbed = data
            for needle in needles:
                scrubbed = scrubbed.replace(needle, REDACTED.encode())
            if scrubbed != data:
                try:
                    path.write_bytes(scrubbed)
                except OSError:
                    # Unwritable: better gone than kept with a secret in it.
                    path.unlink(missing_ok=True)
                changed += 1
    return changed


def keep_trial_outputs(trial_dir: Path, rollout_dir: Path) -> None:
    """Copy a (scrubbed) trial folder's outputs under ``rollout_dir``: ``artifacts/``
    mirrors Harbor's layout (``artifacts/logs/artifacts/<file>``), everything else goes to
    ``harbor/``. Symlinks and special files are skipped, never followed."""
    if not trial_dir.is_dir():
        return
    for child in trial_dir.iterdir():
        if child.is_symlink():
            continue
        target = rollout_dir / (
            "artifacts" if child.name == "artifacts" else f"harbor/{child.name}"
        )
        try:
            if child.is_dir():
                shutil.copytree(child, target, symlinks=True, ignore=_links, dirs_exist_ok=True)
            elif child.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(child, target)
        except OSError as exc:
            logger.warning("cannot keep %s under %s: %s", child, rollout_dir, exc)


def _links(folder: str, names: list[str]) -> list[str]:
    base = Path(folder)
    return [
        n
        for n in names
        if (base / n).is_symlink() or not ((base / n).is_file() or (base / n).is_dir())
    ]


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
