"""`manage.py make_environment NAME`: build an environment (a Debian root filesystem) with debootstrap.

The build (atomic, one at a time, ``--replace`` in one rename, tarballs) is
evaluations/environments/build.py; this command checks its options and the host, and prints.
"""

from __future__ import annotations

import os
import shutil

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from evaluations import environments
from evaluations.environments.build import DEFAULT_MIRROR, DEFAULT_PACKAGES, Builder, BuildError, Interrupted


class Command(BaseCommand):
    help = "Build an environment (a Debian root filesystem) with debootstrap into ENVIRONMENTS_ROOT/NAME."
    requires_system_checks = []  # the service's checks (auth, sandbox) are not this tool's business

    def add_arguments(self, parser):
        parser.add_argument("name", help="the environment's name: [a-z0-9][a-z0-9._-]*")
        parser.add_argument("--suite", default="bookworm", help="the Debian suite (default bookworm)")
        parser.add_argument(
            "--packages",
            default=DEFAULT_PACKAGES,
            help=f"packages to install, separated by spaces or commas (default: {DEFAULT_PACKAGES})",
        )
        parser.add_argument("--mirror", default=DEFAULT_MIRROR, help=f"the Debian mirror (default {DEFAULT_MIRROR})")
        parser.add_argument("--replace", action="store_true", help="replace an existing environment of that name")
        tarball = parser.add_mutually_exclusive_group()
        tarball.add_argument("--save-tarball", metavar="FILE", help="keep the downloaded packages in FILE")
        tarball.add_argument("--from-tarball", metavar="FILE", help="build from a --save-tarball FILE, offline")

    def handle(self, name, suite, packages, mirror, replace, save_tarball, from_tarball, **options):
        config = settings.EXECUTOR
        root = config.environments_root
        if root is None:
            raise CommandError("ENVIRONMENTS_ROOT is not set: it names the folder environments are made in")
        try:
            environments.check_name(name)
        except environments.BadEnvironment as exc:
            raise CommandError(str(exc)) from None
        wanted = [p for p in packages.replace(",", " ").split() if p]
        if not wanted:
            raise CommandError("--packages: name at least one package")
        if os.geteuid() != 0:
            raise CommandError("make_environment needs root: debootstrap makes device files and chroots")
        if shutil.which("debootstrap") is None:
            raise CommandError("debootstrap is not installed (apt-get install debootstrap)")
        if from_tarball and not os.path.isfile(from_tarball):
            raise CommandError(f"--from-tarball: no such file {from_tarball}")
        builder = Builder(root, config.session_ttl_secs, say=self.say, warn=self.stderr.write)
        try:
            built = builder.build(name, suite, wanted, mirror, replace, save_tarball, from_tarball)
        except BuildError as exc:
            raise CommandError(str(exc)) from None
        except Interrupted as exc:
            raise CommandError(
                f"interrupted by {exc}; the partial build was removed", returncode=128 + exc.signum
            ) from None
        env = built.environment
        self.stdout.write(
            f"environment {name}: {env.root} (python {env.python or 'none'}, node {env.node or 'none'}) "
            f"built in {built.seconds:.0f} s"
        )
        if built.retired:
            self.stdout.write(f"the replaced tree is kept as {built.retired} for SESSION_TTL_SECS, then removed")

    def say(self, line: str) -> None:
        """A progress line, flushed: debootstrap's lines are shown as they come."""
        self.stdout.write(line)
        self.stdout.flush()
