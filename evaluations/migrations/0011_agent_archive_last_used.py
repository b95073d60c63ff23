from django.db import migrations


class Migration(migrations.Migration):
    """An archive's time is when it was last submitted, not made: the reaper purges unused ones."""

    dependencies = [
        ("evaluations", "0010_batches"),
    ]

    operations = [
        migrations.RenameField(model_name="agentarchive", old_name="created_at", new_name="last_used_at"),
    ]
