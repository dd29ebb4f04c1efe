"""``python -m multipos.assets``: list the registered assets, or build named ones from their public sources.

    python -m multipos.assets list
    python -m multipos.assets fetch nfcorpus trec-dl-2019 trec-dl-2020 all-MiniLM-L6-v2 [--into DIR]
    python -m multipos.assets fetch msmarco-multipos nq-multipos [--revision REPO=REV ...]

``fetch`` builds each named asset into ``$MULTIPOS_ASSETS`` (or ``--into``) as ``data/<name>`` or
``models/<name>``; an asset already there is left as it is. Downloads are cached in ``$MULTIPOS_CACHE/downloads``;
``MULTIPOS_MIRROR`` replaces every public host by a mirror. ``--revision REPO=REV`` reads hub repository ``REPO`` at
revision ``REV`` (a branch, tag or commit) instead of the registry's (``main``) for the assets built from the hub
(:mod:`multipos.assets.training_data`). Exit status 1 when an asset could not be built.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from multipos.assets import assets_dir, cache_dir
from multipos.assets.build import build_asset
from multipos.assets.download import AssetDownloadError, mirrored_url
from multipos.assets.registry import REGISTRY
from multipos.assets.training_data import REVISIONS_ENV
from multipos.formats.types import DataFormatError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m multipos.assets", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the registered assets and their public source files")
    fetch = sub.add_parser("fetch", help="build named assets from their public sources")
    fetch.add_argument("names", nargs="+", metavar="NAME", choices=sorted(REGISTRY))
    fetch.add_argument("--into", type=Path, default=None, help="assets folder (default: $MULTIPOS_ASSETS)")
    fetch.add_argument("--revision", action="append", default=[], metavar="REPO=REV",
                       help="read hub repository REPO at revision REV (branch, tag or commit); repeatable")
    args = parser.parse_args(argv)
    for item in getattr(args, "revision", []):
        if "=" not in item or not item.partition("=")[2]:
            parser.error(f"--revision {item!r}: expected REPO=REV, e.g. Tevatron/msmarco-passage=main")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "list":
        for asset in REGISTRY.values():
            print(f"{asset.kind}/{asset.name}: {asset.description}")
            if asset.requires:
                print(f"    needs: {', '.join(asset.requires)}")
            for s in asset.sources:
                size = f"  {s.size:,} bytes" if s.size else ""
                print(f"    {mirrored_url(s.url)}  {s.hash or '(no published hash: sha256 recorded on first download)'}"
                      f"{size}  [{s.licence}]")
            for role in ("annotations", "groups"):  # hub repositories (multipos.assets.training_data)
                if spec := asset.options.get(role):
                    print(f"    hub {spec['repo']}@{spec['revision']} ({role}): {', '.join(spec['patterns'])}  (no "
                          f"published hash: sha256 recorded on first download)  [{spec['licence']}]")
        return 0
    root = (args.into or assets_dir()).expanduser()
    failed = 0
    before = os.environ.get(REVISIONS_ENV)
    if args.revision:  # read by the hub builders (multipos.assets.training_data.hub_revision)
        os.environ[REVISIONS_ENV] = ",".join([*args.revision, *([before] if before else [])])
    try:
        for name in args.names:
            try:
                print(f"{name}: {build_asset(name, root, cache_dir() / 'downloads')}")
            except (AssetDownloadError, DataFormatError, OSError) as e:
                failed += 1
                print(f"{name}: not built: {e}", file=sys.stderr)
    finally:
        if before is None:
            os.environ.pop(REVISIONS_ENV, None)
        else:
            os.environ[REVISIONS_ENV] = before
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
