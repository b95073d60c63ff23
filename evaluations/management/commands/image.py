"""`manage.py image ...`: the image store of this host (SPEC §16), for operators.

1. ``pull REF``: into the store (the layers it has are not downloaded again).
2. ``build DIR [--file F] [--tag NAME] [--build-arg K=V ...] [--target STAGE]``: a Dockerfile,
   its RUNs in the sandbox as an evaluation's commands are (worker/localrun.py sets that up).
3. ``list [--json]``: one line per reference: ref, short digest, size, last used.
4. ``remove REF...``: a reference (its image goes with its last one) or a digest (the image and
   all its references); the layers go at the next ``prune`` or eviction. An unknown or pinned one is an
   error (exit status 1), the others are still removed.
5. ``prune``: layers and blobs no image uses. ``import FILE``: a ``docker save`` or OCI archive.
   ``export REF FILE [--format docker|oci]``: the reverse.

The work is in evaluations/images/; after a pull, build or import the store keeps itself under
IMAGES_MAX_BYTES (store.using). Errors are one sentence and exit status 1.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from evaluations.images import archive
from evaluations.images.errors import ImageError
from evaluations.images.pull import pull
from evaluations.images.reference import parse
from evaluations.images.store import ImageStore
from evaluations.management.commands.cache import human_size

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class Command(BaseCommand):
    help = "Pull, build, list, remove, prune, import and export the images of this host's image store."
    requires_system_checks = []  # the service's checks (AUTH_TOKEN...) say nothing about the store

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        actions.add_parser("pull", help="pull REF from its registry").add_argument("ref", metavar="REF")
        build = actions.add_parser("build", help="build the Dockerfile of DIR (the build context)")
        build.add_argument("context", metavar="DIR")
        build.add_argument("--file", "-f", metavar="F", help="the Dockerfile (default DIR/Dockerfile)")
        build.add_argument("--tag", "-t", metavar="NAME", help="a reference to save the image under")
        build.add_argument("--build-arg", action="append", default=[], metavar="K=V", help="an ARG (repeatable)")
        build.add_argument("--target", metavar="STAGE", help="the stage to build (default: the last)")
        listing = actions.add_parser("list", help="ref, digest, size, last used")
        listing.add_argument("--json", action="store_true", help="the rows of GET /images as JSON")
        actions.add_parser("remove", help="forget references or digests").add_argument("refs", nargs="+", metavar="REF")
        actions.add_parser("prune", help="remove layers and blobs no image uses")
        actions.add_parser("import", help="a docker save or OCI archive").add_argument("file", metavar="FILE")
        export = actions.add_parser("export", help="an image as a docker save or OCI archive")
        export.add_argument("ref", metavar="REF")
        export.add_argument("file", metavar="FILE")
        export.add_argument("--format", choices=("docker", "oci"), default="docker")

    def handle(self, *args, action, **options):
        if options["verbosity"] < 2:  # the sandbox's start-up notes (as the worker logs them) say nothing of images
            for name in ("term_executor", "evaluations"):
                logging.getLogger(name).setLevel(logging.ERROR)
        config = settings.EXECUTOR
        store = ImageStore.of(config)
        try:
            getattr(self, f"_{action}")(store, config, options)
        except ImageError as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:  # a FILE that cannot be read or written
            raise CommandError(f"{exc.filename or 'the image store'}: {exc.strerror or exc}.") from None

    def _pull(self, store, config, options) -> None:
        result = pull(options["ref"], store=store, config=config, progress=self.stdout.write)
        self._done("pulled", result)

    def _build(self, store, config, options) -> None:
        from evaluations.worker import localrun

        build_args = {}
        for item in options["build_arg"]:
            name, equals, value = item.partition("=")
            if not equals or not name:
                raise CommandError(f"--build-arg {item}: expected K=V")
            build_args[name] = value
        context = Path(options["context"])
        dockerfile = Path(options["file"]) if options["file"] else context / "Dockerfile"
        try:
            result = localrun.build_image(
                dockerfile, context, build_args, options["target"], tag=options["tag"], store=store, config=config,
                progress=self.stdout.write,
            )  # fmt: skip
        except localrun.LocalRunError as exc:
            raise CommandError(str(exc)) from None
        self._done("built", result)

    def _done(self, verb: str, result) -> None:
        record = result.record
        names = ", ".join(record.refs) or "untagged"
        self.stdout.write(f"{verb} {names}: {record.digest}{' (cached)' if result.cached else ''}")

    def _list(self, store, config, options) -> None:
        rows = store.listing()
        if options["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        self.stdout.write(f"{'REF':60}  {'DIGEST':19}  {'SIZE':>9}  LAST USED")
        for row in rows:
            self.stdout.write(
                f"{row['ref'] or '<none>':60}  {row['digest'][:19]}  {human_size(row['size_bytes']):>9}  "
                f"{row['last_used_at'][:19].replace('T', ' ')}"
            )
        self.stdout.write(f"{len(rows)} references; {human_size(store.total_bytes())} in {store.root}")

    def _remove(self, store, config, options) -> None:
        problems = []
        for text in options["refs"]:
            try:
                record = store.remove(_canonical(text, config))
            except ImageError as exc:
                problems.append(str(exc))
                continue
            self.stdout.write(f"removed {text} ({record.digest})")
        if problems:
            raise CommandError(" ".join(problems))

    def _prune(self, store, config, options) -> None:
        self.stdout.write(f"freed {human_size(store.prune())}")

    def _import(self, store, config, options) -> None:
        path = Path(options["file"])
        if not path.is_file():
            raise CommandError(f"There is no file {path}.")
        for record in archive.import_archive(path, store, config):
            self.stdout.write(f"imported {', '.join(record.refs) or 'untagged'}: {record.digest}")

    def _export(self, store, config, options) -> None:
        text = options["ref"]
        wanted = _canonical(text, config)
        record = store.image(wanted if _DIGEST.fullmatch(wanted) else store.resolve_tag(wanted) or "")
        if record is None:
            raise CommandError(f"There is no image {text} in the store.")
        archive.export_image(store, record, options["file"], format=options["format"])
        self.stdout.write(f"exported {text} ({record.digest}) to {options['file']} ({options['format']} format)")


def _canonical(text: str, config) -> str:
    """A digest as given, else the reference as the store names it (``python:3.12`` ->
    ``docker.io/library/python:3.12``); ImageError on a malformed one."""
    return text if _DIGEST.fullmatch(text) else str(parse(text, config.image_default_registry))
