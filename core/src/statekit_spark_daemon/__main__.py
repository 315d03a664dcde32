"""``python -m statekit_spark_daemon``: PySpark's daemon, PySpark imported from its installed package.

A worker's collection after each task is of the young generations (see the package's docstring).
"""

from statekit_spark_daemon import use_installed_pyspark, young_collections_after_tasks

use_installed_pyspark()

from pyspark import daemon  # noqa: E402  (after the choice of where pyspark comes from)

young_collections_after_tasks(daemon)
daemon.manager()
