"""`manage.py reap_sessions [--dry-run]`: the cron-able cleaner.

1. Cancels evaluations past SESSION_TTL_SECS (running ones are asked to stop;
   their worker kills them).
2. Fails running evaluations whose worker stopped beating ("executor worker lost")
   and kills whatever of them is left on this host.
3. Deletes session folders under WORKSPACE_BASE that belong to no live
   evaluation, never following a link out of it.
4. Purges evaluations older than RETENTION_DAYS (0 keeps them).
5. Tends the workspace cache and the image store: builds a dead process left
   (unmounted and removed) and image pins whose holder died.
Every part is conditional on the state it expects: safe twice, safe beside a worker.
"""

from django.conf import settings
from django.core.management.base import BaseCommand

from evaluations.worker.reaper import reap


class Command(BaseCommand):
    help = (
        "Cancel expired evaluations, fail lost workers' ones, delete orphan session folders, purge old rows, "
        "remove dead builds and pins of the image store."
    )

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="count what would be done, change nothing")

    def handle(self, *args, dry_run=False, **options):
        summary = reap(settings.EXECUTOR, dry_run=dry_run)
        self.stdout.write(summary.line(dry_run))
