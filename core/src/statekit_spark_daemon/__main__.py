"""``python -m statekit_spark_daemon``: PySpark's daemon, PySpark imported from its installed package."""

from statekit_spark_daemon import use_installed_pyspark

use_installed_pyspark()

from pyspark import daemon  # noqa: E402  (after the choice of where pyspark comes from)

daemon.manager()
