package streamstate.kstreams;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.nio.charset.StandardCharsets;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The expected tokens are what core.semantics.tokenize gives for the same text. */
class TokensTest {
  private static List<String> tokens(String line) {
    return Tokens.of(line.getBytes(StandardCharsets.UTF_8));
  }

  @Test
  void asciiLinesAreLowerCasedAndSplitOnNonWordCharacters() {
    assertEquals(
        List.of("hello", "world", "hello_world", "42"), tokens("Hello, World! hello_world 42"));
    assertEquals(List.of(), tokens("  -- "));
  }

  @Test
  void unicodeLettersAndNumbersAreWordCharacters() {
    assertEquals(
        List.of("\u00e9cole", "d", "\u00e9t\u00e9", "na\u00efve"),
        tokens("\u00c9COLE d'\u00e9t\u00e9\u2014na\u00efve"));
    assertEquals(List.of("x\u00b2", "y\u00b2", "\u00bd"), tokens("x\u00b2+y\u00b2 = \u00bd"));
    assertEquals(
        List.of("\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\u3067\u3059"),
        tokens("\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u3067\u3059\u3002"));
  }

  @Test
  void combiningMarksSplitWordsAsInPython() {
    assertEquals(List.of("e", "te"), tokens("e\u0301te\u0301"));
  }

  @Test
  void lowerCasingIsPythonsFullMappingWithFinalSigma() {
    assertEquals(
        List.of("\u03bf\u03b4\u03bf\u03c2", "\u03c3\u03bf\u03c6\u03bf\u03c2"),
        tokens("\u039f\u0394\u039f\u03a3 \u03a3\u039f\u03a6\u039f\u03a3"));
    assertEquals(List.of("i", "stanbul"), tokens("\u0130stanbul"));
    assertEquals(List.of("stra\u00dfe", "strasse"), tokens("stra\u00dfe STRASSE"));
  }

  @Test
  void aLineThatIsNotUtf8HasNoTokens() {
    assertNull(Tokens.of(new byte[] {'a', (byte) 0xff, 'b'}));
  }
}
