package streamstate.jobs;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.api.java.UDF1;

/**
 * The tokens of a text line as the stream finds them ({@link PythonText}); null for a line
 * that is not valid UTF-8 (a null value too), which the stream dead-letters.
 */
public final class Words implements UDF1<byte[], String[]> {
  private static final long serialVersionUID = 1L;
  private transient PythonText text;

  @Override
  public String[] call(byte[] line) {
    if (line == null) {
      return null;
    }
    if (text == null) {
      text = new PythonText();
    }
    List<String> words = new ArrayList<>();
    return text.tokens(line, words::add) ? words.toArray(new String[0]) : null;
  }
}
