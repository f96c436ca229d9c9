package streamstate.jobs;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.api.java.UDF1;

/**
 * The words of a pure-ASCII text line, as the stream tokenises it ({@code app/semantics.py}
 * tokenize): lower-cased, split on runs of characters other than {@code [a-zA-Z0-9_]} (Python's
 * {@code \W} on ASCII), without empty tokens.
 *
 * <p>Returns null for a line with any byte outside ASCII: the caller hands it to the stream's own
 * Python tokeniser (Unicode word characters and case mapping, UTF-8 validation).
 */
public final class AsciiWords implements UDF1<byte[], String[]> {
  private static final long serialVersionUID = 1L;

  @Override
  public String[] call(byte[] line) {
    if (line == null) {
      return null;
    }
    for (byte b : line) {
      if (b < 0) {
        return null; // a byte >= 0x80: not ASCII
      }
    }
    byte[] lower = new byte[line.length];
    List<String> words = new ArrayList<>();
    int start = -1;
    for (int i = 0; i <= line.length; i++) {
      byte b = i < line.length ? line[i] : (byte) ' ';
      boolean word = (b >= 'a' && b <= 'z') || (b >= '0' && b <= '9') || b == '_'
          || (b >= 'A' && b <= 'Z');
      if (word) {
        lower[i] = (b >= 'A' && b <= 'Z') ? (byte) (b + ('a' - 'A')) : b;
        if (start < 0) {
          start = i;
        }
      } else if (start >= 0) {
        words.add(new String(lower, start, i - start, StandardCharsets.US_ASCII));
        start = -1;
      }
    }
    return words.toArray(new String[0]);
  }
}
