from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("evaluations", "0005_egress_resources"),
    ]

    operations = [
        migrations.AddField(
            model_name="evaluation",
            name="retry_of",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=models.deletion.SET_NULL,
                related_name="retries",
                to="evaluations.evaluation",
            ),
        ),
    ]
