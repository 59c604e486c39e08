from django.db import migrations, models

# committed_at: the database's clock when the transaction that wrote the row commits. A
# deferred constraint trigger runs at commit, after everything else the transaction did.
COMMITTED_AT = """
CREATE FUNCTION testjobs_deliveryrecord_committed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE testjobs_deliveryrecord SET committed_at = clock_timestamp() WHERE id = NEW.id;
    RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER testjobs_deliveryrecord_committed
    AFTER INSERT ON testjobs_deliveryrecord
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION testjobs_deliveryrecord_committed();
"""

DROP_COMMITTED_AT = """
DROP TRIGGER testjobs_deliveryrecord_committed ON testjobs_deliveryrecord;
DROP FUNCTION testjobs_deliveryrecord_committed();
"""


class Migration(migrations.Migration):
    dependencies = [("testjobs", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="DeliveryRecord",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("event_id", models.UUIDField(db_index=True)),
                ("aggregate_id", models.UUIDField()),
                ("sequence", models.IntegerField()),
                ("subscriber", models.TextField()),
                ("attempts", models.IntegerField()),
                ("pid", models.IntegerField()),
                (
                    "recorded_at",
                    models.DateTimeField(db_default=models.Func(function="clock_timestamp")),
                ),
                ("committed_at", models.DateTimeField(null=True)),
            ],
        ),
        migrations.RunSQL(COMMITTED_AT, DROP_COMMITTED_AT),
    ]
