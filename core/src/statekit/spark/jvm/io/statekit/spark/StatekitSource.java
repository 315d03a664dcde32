package io.statekit.spark;

import com.codahale.metrics.Counter;
import com.codahale.metrics.Gauge;
import com.codahale.metrics.MetricRegistry;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.SparkEnv;
import org.apache.spark.metrics.MetricsSystem;
import org.apache.spark.metrics.source.Source;
import scala.collection.Iterator;

/**
 * One statekit job's metrics in the driver's Spark metrics system (JMX, the Prometheus servlet,
 * every configured sink), named {@code <source name>.<metric>}.
 *
 * <p>The values are computed by statekit's Python driver after each micro-batch and handed over
 * in one Py4J call ({@link #update}): the executors send nothing of their own.
 */
public final class StatekitSource implements Source {
  private final String name;
  private final MetricRegistry registry = new MetricRegistry();
  private final ConcurrentHashMap<String, Number> values = new ConcurrentHashMap<>();

  private StatekitSource(String name) {
    this.name = name;
  }

  @Override
  public String sourceName() {
    return name;
  }

  @Override
  public MetricRegistry metricRegistry() {
    return registry;
  }

  /**
   * The source named {@code name}, registered with the driver's metrics system in place of any
   * source of that name registered before (an earlier run of the same job in this application).
   */
  public static StatekitSource register(String name) {
    MetricsSystem system = SparkEnv.get().metricsSystem();
    Iterator<Source> old = system.getSourcesByName(name).iterator();
    while (old.hasNext()) {
      system.removeSource(old.next());
    }
    StatekitSource source = new StatekitSource(name);
    system.registerSource(source);
    return source;
  }

  /**
   * The current values of the source named {@code name} in the driver's metrics system (gauges'
   * values, counters' counts), by metric name; empty if there is none. Py4J cannot reflect on
   * {@code SparkEnv} itself, so callers in Python read them here.
   */
  public static Map<String, Object> values(String name) {
    Map<String, Object> out = new TreeMap<>();
    Iterator<Source> sources = SparkEnv.get().metricsSystem().getSourcesByName(name).iterator();
    while (sources.hasNext()) {
      MetricRegistry r = sources.next().metricRegistry();
      r.getGauges().forEach((k, g) -> out.put(k, g.getValue()));
      r.getCounters().forEach((k, c) -> out.put(k, c.getCount()));
    }
    return out;
  }

  /** Takes this source out of the driver's metrics system (the query ended). */
  public void unregister() {
    SparkEnv env = SparkEnv.get();
    if (env != null) {
      env.metricsSystem().removeSource(this);
    }
  }

  /**
   * Sets gauges and adds to counters, one per line: {@code name=value} sets gauge {@code name}
   * (created on first use; an integer value stays a long), {@code name+=n} adds {@code n} to
   * counter {@code name}.
   */
  public void update(String lines) {
    for (String line : lines.split("\n")) {
      if (line.isEmpty()) {
        continue;
      }
      int eq = line.indexOf('=');
      if (eq <= 0) {
        throw new IllegalArgumentException("statekit metrics: not name=value: " + line);
      }
      if (line.charAt(eq - 1) == '+') {
        counter(line.substring(0, eq - 1)).inc(Long.parseLong(line.substring(eq + 1)));
      } else {
        gauge(line.substring(0, eq), parse(line.substring(eq + 1)));
      }
    }
  }

  private static Number parse(String text) {
    try {
      return Long.parseLong(text);
    } catch (NumberFormatException e) {
      return Double.parseDouble(text);
    }
  }

  private Counter counter(String metric) {
    return registry.counter(metric);
  }

  private void gauge(String metric, Number value) {
    if (values.put(metric, value) == null) {
      registry.register(metric, (Gauge<Number>) () -> values.get(metric));
    }
  }
}
