package streamstate.kstreams;

/** A record that fails validation; the message names the field. */
public final class InvalidEvent extends Exception {
  private static final long serialVersionUID = 1L;

  public InvalidEvent(String reason) {
    super(reason, null, false, false);
  }
}
