// Emitting events to user listeners from inside the client's bookkeeping,
// where a listener that throws must not leave the client half-updated.

/** Calls `emit` and, if a listener throws, rethrows that on a later tick so the client's state stays whole. */
export function emitSafely(emitter, event, ...args) {
  try {
    emitter.emit(event, ...args);
  } catch (err) {
    process.nextTick(() => {
      throw err;
    });
  }
}
