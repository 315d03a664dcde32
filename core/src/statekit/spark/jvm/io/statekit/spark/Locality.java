package io.statekit.spark;

import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.util.CollectionAccumulator;

/** The entry point statekit's driver calls through Py4J. */
public final class Locality {
  private Locality() {}

  /**
   * {@code df}'s rows, partition for partition, as a DataFrame whose partition i prefers to run
   * on the executors {@code preferred[i]} names (none where empty), reporting into {@code ran}.
   * The scan, shuffle and projections of {@code df} stay in the same stage as whatever consumes
   * the result: it is a narrow wrapper around {@code df}'s own RDD.
   */
  public static Dataset<Row> prefer(
      Dataset<Row> df, String[][] preferred, CollectionAccumulator<String> ran) {
    org.apache.spark.sql.classic.Dataset<Row> classic = (org.apache.spark.sql.classic.Dataset<Row>) df;
    RDD<InternalRow> rows = classic.queryExecution().toRdd();
    PreferredLocationsRDD<InternalRow> located = new PreferredLocationsRDD<>(rows, preferred, ran);
    return classic.sparkSession().internalCreateDataFrame(located, classic.schema(), false);
  }

  /** A fresh accumulator of task locations, registered with the session's SparkContext. */
  public static CollectionAccumulator<String> accumulator(Dataset<Row> df) {
    org.apache.spark.sql.classic.Dataset<Row> classic = (org.apache.spark.sql.classic.Dataset<Row>) df;
    CollectionAccumulator<String> acc = new CollectionAccumulator<>();
    classic.sparkSession().sparkContext().register(acc, "statekit.task-locations");
    return acc;
  }
}
