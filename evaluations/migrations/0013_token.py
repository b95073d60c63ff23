import django.core.validators
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    """Tenants' tokens made in the admin (SPEC §20): a name and the token's SHA-256, never the token."""

    dependencies = [
        ("evaluations", "0012_owner"),
    ]

    operations = [
        migrations.CreateModel(
            name="Token",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "name",
                    models.CharField(
                        help_text="The tenant: what its evaluations' and batches' owner holds.",
                        max_length=64,
                        validators=[
                            django.core.validators.RegexValidator(
                                "\\A[A-Za-z0-9_.-]{1,64}\\Z", "1 to 64 of A-Z a-z 0-9 _ . -"
                            )
                        ],
                    ),
                ),
                ("sha256", models.CharField(editable=False, max_length=64, unique=True)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now, editable=False)),
            ],
        ),
    ]
