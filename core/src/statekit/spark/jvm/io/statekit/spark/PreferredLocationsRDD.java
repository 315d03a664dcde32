package io.statekit.spark;

import org.apache.spark.Partition;
import org.apache.spark.Partitioner;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.rdd.RDD;
import org.apache.spark.storage.BlockManagerId;
import org.apache.spark.util.CollectionAccumulator;
import scala.Option;
import scala.collection.Iterator;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Its parent's partitions, each with the executor that should compute it as preferred location.
 *
 * <p>Spark's own state stores do this (StateStoreRDD asks the StateStoreCoordinator): the
 * scheduler then runs a partition's task on the executor that holds its open state, waiting up to
 * {@code spark.locality.wait} for it. Every computed partition reports where it ran into
 * {@code ran} as "partition TAB executor_host_id", the form the scheduler reads back as an
 * executor location; a partition whose task ran several times reports several times.
 */
public final class PreferredLocationsRDD<T> extends RDD<T> {
  private static final long serialVersionUID = 1L;

  private final String[][] preferred;
  private final CollectionAccumulator<String> ran;

  public PreferredLocationsRDD(
      RDD<T> parent, String[][] preferred, CollectionAccumulator<String> ran) {
    super(parent, parent.elementClassTag());
    this.preferred = preferred;
    this.ran = ran;
  }

  @Override
  public Partition[] getPartitions() {
    return firstParent(elementClassTag()).partitions();
  }

  @Override
  public Option<Partitioner> partitioner() {
    return firstParent(elementClassTag()).partitioner();
  }

  @Override
  public Seq<String> getPreferredLocations(Partition split) {
    int i = split.index();
    String[] here = i < preferred.length && preferred[i] != null ? preferred[i] : new String[0];
    return CollectionConverters.asScala(java.util.Arrays.asList(here)).toList();
  }

  @Override
  public Iterator<T> compute(Partition split, TaskContext context) {
    ran.add(split.index() + "\t" + executorLocation());
    return firstParent(elementClassTag()).iterator(split, context);
  }

  /** This executor as the scheduler names an executor location: executor_HOST_ID. */
  public static String executorLocation() {
    BlockManagerId id = SparkEnv.get().blockManager().blockManagerId();
    return "executor_" + id.host() + "_" + id.executorId();
  }
}
