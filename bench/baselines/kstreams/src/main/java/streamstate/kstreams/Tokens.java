package streamstate.kstreams;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/**
 * The words of a {@code text-lines} record as the contract defines them: the line lower-cased,
 * split on runs of non-word characters, empty tokens dropped ({@code re.split(r"\W+",
 * line.lower())} in Python).
 *
 * <p>Python's {@code \w} is a letter (Unicode categories L*), a number (N*) or {@code _}; Java's
 * own {@code \w} with {@code UNICODE_CHARACTER_CLASS} also takes combining marks and every
 * connector punctuation, so the class is spelled out here. The categories come from the JDK's
 * Unicode tables (Unicode 13 in JDK 17); characters assigned later are not word characters here.
 */
public final class Tokens {
  private Tokens() {}

  /** The tokens of {@code line}, or null when it is not valid UTF-8. */
  public static List<String> of(byte[] line) {
    List<String> out = new ArrayList<>();
    for (byte b : line) {
      if (b < 0) {
        String text = decode(line);
        if (text == null) {
          return null;
        }
        unicode(text.toLowerCase(Locale.ROOT), out);
        return out;
      }
    }
    ascii(line, out);
    return out;
  }

  /** Strict UTF-8, or null. */
  public static String decode(byte[] raw) {
    try {
      return StandardCharsets.UTF_8
          .newDecoder()
          .onMalformedInput(CodingErrorAction.REPORT)
          .onUnmappableCharacter(CodingErrorAction.REPORT)
          .decode(ByteBuffer.wrap(raw))
          .toString();
    } catch (CharacterCodingException error) {
      return null;
    }
  }

  /** Whether {@code cp} is a word character of Python's {@code \w}. */
  public static boolean isWord(int cp) {
    if (cp == '_') {
      return true;
    }
    switch (Character.getType(cp)) {
      case Character.UPPERCASE_LETTER:
      case Character.LOWERCASE_LETTER:
      case Character.TITLECASE_LETTER:
      case Character.MODIFIER_LETTER:
      case Character.OTHER_LETTER:
      case Character.DECIMAL_DIGIT_NUMBER:
      case Character.LETTER_NUMBER:
      case Character.OTHER_NUMBER:
        return true;
      default:
        return false;
    }
  }

  private static void ascii(byte[] line, List<String> out) {
    char[] word = new char[line.length];
    int length = 0;
    for (byte b : line) {
      if (b >= 'A' && b <= 'Z') {
        word[length++] = (char) (b + ('a' - 'A'));
      } else if ((b >= 'a' && b <= 'z') || (b >= '0' && b <= '9') || b == '_') {
        word[length++] = (char) b;
      } else if (length > 0) {
        out.add(new String(word, 0, length));
        length = 0;
      }
    }
    if (length > 0) {
      out.add(new String(word, 0, length));
    }
  }

  private static void unicode(String lowered, List<String> out) {
    int start = -1;
    int i = 0;
    while (i < lowered.length()) {
      int cp = lowered.codePointAt(i);
      if (isWord(cp)) {
        if (start < 0) {
          start = i;
        }
      } else if (start >= 0) {
        out.add(lowered.substring(start, i));
        start = -1;
      }
      i += Character.charCount(cp);
    }
    if (start >= 0) {
      out.add(lowered.substring(start));
    }
  }
}
