import { describe, expect, it } from '@jest/globals';
import { CLAIMED_AT_COMMIT, foundAtOnce, type ClaimRow } from '../../lib/postgres/claim-row.reader.js';

/**
 * What a claim's first row means without another statement (claim-row.reader.ts): the rows of
 * nearly every delivery, read without a database.
 */
describe('foundAtOnce: a claim row settled without another statement', () => {
  const row = (fields: Partial<ClaimRow>): ClaimRow => ({
    claimed: false,
    status: null,
    previous: '5s',
    ...fields,
  });
  const check = { fingerprint: 'f1', refuse: true, storesResponse: true };

  it('an inserted row is a first claim, not one made at the COMMIT', () => {
    const found = foundAtOnce(row({ claimed: true }));
    expect(found).toEqual({ kind: 'claimed', reclaimed: false });
    expect(found).not.toBe(CLAIMED_AT_COMMIT);
  });

  it("the claim at commit's lock taken and no row is CLAIMED_AT_COMMIT, the one object its claimer tells by identity", () => {
    expect(foundAtOnce(row({ claimed: true, locked: true }))).toBe(CLAIMED_AT_COMMIT);
  });

  it('a done row is done; with key checks, with its fingerprint and stored response', () => {
    expect(foundAtOnce(row({ status: 'done', fingerprint: 'f0' }))).toEqual({ kind: 'done' });
    const response = { status: 201, body: { id: 1 } };
    expect(foundAtOnce(row({ status: 'done', fingerprint: 'f0', response }), check)).toEqual({
      kind: 'done',
      fingerprint: 'f0',
      response,
    });
  });

  it.each(['failed', 'in_progress', null])('a %s row needs more statements (undefined)', (status) => {
    expect(foundAtOnce(row({ status, locked: false }), check)).toBeUndefined();
  });
});
