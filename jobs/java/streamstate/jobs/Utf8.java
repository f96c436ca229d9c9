package streamstate.jobs;

/** Strict UTF-8 decoding: well-formed sequences only, as Python's decoder accepts them. */
final class Utf8 {
  private Utf8() {}

  /**
   * Decodes {@code in} into {@code out} (at least {@code in.length} long) and returns how many
   * code points it holds, or -1 for a byte sequence that is not well-formed UTF-8 (The Unicode
   * Standard, table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF).
   */
  static int decode(byte[] in, int[] out) {
    int n = 0;
    int i = 0;
    while (i < in.length) {
      int b0 = in[i] & 0xFF;
      if (b0 < 0x80) {
        out[n++] = b0;
        i++;
        continue;
      }
      int need, cp, low = 0x80, high = 0xBF;
      if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 1;
        cp = b0 & 0x1F;
      } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 2;
        cp = b0 & 0x0F;
        if (b0 == 0xE0) {
          low = 0xA0;
        } else if (b0 == 0xED) {
          high = 0x9F; // no surrogates
        }
      } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 3;
        cp = b0 & 0x07;
        if (b0 == 0xF0) {
          low = 0x90;
        } else if (b0 == 0xF4) {
          high = 0x8F; // nothing above U+10FFFF
        }
      } else {
        return -1;
      }
      if (i + need >= in.length) { // truncated
        return -1;
      }
      for (int k = 1; k <= need; k++) {
        int b = in[i + k] & 0xFF;
        if (b < low || b > high) {
          return -1;
        }
        low = 0x80;
        high = 0xBF;
        cp = (cp << 6) | (b & 0x3F);
      }
      out[n++] = cp;
      i += need + 1;
    }
    return n;
  }
}
