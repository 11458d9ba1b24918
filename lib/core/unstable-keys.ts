/**
 * Remembers, per handler, which key each webhook fingerprint last arrived under, for a while: the
 * same fingerprint under another key within the window is one event whose key changes between
 * its copies (taken from the moment of arrival: a timestamp, a per-request UUID), which turns
 * every retry into a new event. In memory, bounded: a Map in insertion order, the oldest entry
 * forgotten first once it holds `capacity`. Pure, no Nest: KeyFindings reports what it finds.
 */
export class UnstableKeys {
  private readonly seen = new Map<string, { key: string; at: number }>();

  constructor(
    /** How long a fingerprint is remembered, in ms. */
    private readonly windowMs: number,
    /** How many fingerprints are remembered at most. */
    private readonly capacity: number,
  ) {}

  /**
   * Records that `fingerprint` arrived under `key` for `scope`, and returns the other key it
   * arrived under within the window, if any.
   */
  see(scope: string, fingerprint: string, key: string, now = performance.now()): string | undefined {
    const id = `${scope}\u0000${fingerprint}`;
    const earlier = this.seen.get(id);
    if (earlier !== undefined && now - earlier.at <= this.windowMs) {
      // Same key: a retry as it should be. The entry keeps its first arrival, so a key that keeps
      // changing is still found within the window of the first copy.
      return earlier.key === key ? undefined : earlier.key;
    }
    if (earlier !== undefined) this.seen.delete(id);
    else if (this.seen.size >= this.capacity) this.seen.delete(this.seen.keys().next().value!);
    this.seen.set(id, { key, at: now });
    return undefined;
  }
}
