package io.statekit.spark;

import jakarta.servlet.http.HttpServletRequest;
import java.util.Map;
import java.util.TreeMap;
import org.apache.spark.SparkContext;
import org.apache.spark.ui.SparkUI;
import org.apache.spark.ui.SparkUITab;
import org.apache.spark.ui.UIUtils;
import org.apache.spark.ui.WebUIPage;
import scala.Option;
import scala.collection.immutable.Seq;
import scala.xml.Node;
import scala.xml.XML;

/**
 * A "Statekit" tab in the driver's Spark UI, as Flink's web UI has a Checkpoints tab: per job and
 * operator, the state's entries and bytes, the checkpoint history with its phases and sizes, how
 * each recent micro-batch came by its state, and the last failure.
 *
 * <p>statekit's Python driver renders each job's section (well-formed XHTML) after every
 * micro-batch and hands it over in one Py4J call ({@link #publish}); the page puts the sections
 * together inside Spark's own page frame. Spark's UI classes are {@code private[spark]} in Scala
 * and public in the bytecode; this class is compiled against the Spark it runs on (see
 * {@code _jvm_build.py}), which the driver checks before it loads the helper.
 */
public final class StatekitUiTab extends SparkUITab {
  private static final Map<String, String> SECTIONS = new TreeMap<>();
  private static StatekitUiTab attached;
  private final SparkUI ui;

  private StatekitUiTab(SparkUI ui) {
    super(ui, "statekit");
    this.ui = ui;
    attachPage(new Page(this));
  }

  @Override
  public String name() {
    return "Statekit";
  }

  /**
   * Attaches the tab to {@code sc}'s UI, once per UI; false when the UI is off
   * ({@code spark.ui.enabled=false}).
   */
  public static synchronized boolean attach(SparkContext sc) {
    Option<SparkUI> ui = sc.ui();
    if (ui.isEmpty()) {
      return false;
    }
    if (attached == null || attached.ui != ui.get()) {
      StatekitUiTab tab = new StatekitUiTab(ui.get());
      ui.get().attachTab(tab);
      attached = tab;
    }
    return true;
  }

  /** Sets the section of one job's operator ({@code key} orders the sections on the page). */
  public static void publish(String key, String xhtml) {
    synchronized (SECTIONS) {
      SECTIONS.put(key, xhtml);
    }
  }

  /** The page's content as the sections make it, one well-formed XHTML element. */
  public static String content() {
    StringBuilder out = new StringBuilder("<div id=\"statekit\">");
    synchronized (SECTIONS) {
      if (SECTIONS.isEmpty()) {
        out.append("<p>No statekit query has completed a micro-batch in this application yet.</p>");
      }
      for (String section : SECTIONS.values()) {
        out.append(section);
      }
    }
    return out.append("</div>").toString();
  }

  private static final class Page extends WebUIPage {
    private final StatekitUiTab tab;

    Page(StatekitUiTab tab) {
      super("");
      this.tab = tab;
    }

    @Override
    public Seq<Node> render(HttpServletRequest request) {
      Seq<Node> body = XML.loadString(content());
      return UIUtils.headerSparkPage(
          request,
          "Statekit",
          () -> body,
          tab,
          UIUtils.headerSparkPage$default$5(),
          UIUtils.headerSparkPage$default$6(),
          UIUtils.headerSparkPage$default$7(),
          UIUtils.headerSparkPage$default$8());
    }
  }
}
