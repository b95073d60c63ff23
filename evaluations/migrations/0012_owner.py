from django.db import migrations, models


class Migration(migrations.Migration):
    """Tenants (SPEC §20): each evaluation and batch records the AUTH_TOKENS name that created it."""

    dependencies = [
        ("evaluations", "0011_agent_archive_last_used"),
    ]

    operations = [
        migrations.AddField(
            model_name="batch",
            name="owner",
            field=models.CharField(
                blank=True,
                help_text="the tenant (AUTH_TOKENS name) that created it; null: an operator's token, no auth, or manage.py evaluate",
                max_length=64,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="evaluation",
            name="owner",
            field=models.CharField(
                blank=True,
                help_text="the tenant (AUTH_TOKENS name) that created it; null: an operator's token, no auth, or manage.py evaluate",
                max_length=64,
                null=True,
            ),
        ),
        migrations.AddIndex(
            model_name="batch",
            index=models.Index(
                condition=models.Q(("owner__isnull", False)),
                fields=["owner", "-created_at", "-id"],
                name="batch_owner_list_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="evaluation",
            index=models.Index(
                condition=models.Q(("owner__isnull", False)),
                fields=["owner", "-created_at", "-id"],
                name="eval_owner_list_idx",
            ),
        ),
    ]
