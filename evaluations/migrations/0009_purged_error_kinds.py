from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("evaluations", "0008_agents_batches_outcomes"),
    ]

    operations = [
        migrations.AddField(
            model_name="purgedtotals",
            name="error_kinds",
            field=models.JSONField(default=dict),
        ),
    ]
