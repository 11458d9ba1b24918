import type { INestApplicationContext } from '@nestjs/common';

/**
 * The error `app.init()` rejects with, for tests of what must fail the boot; the app is closed
 * either way. Rejects when the app booted.
 */
export async function bootFailure(
  app: INestApplicationContext & { init(): Promise<unknown> },
): Promise<Error> {
  let failure: unknown;
  try {
    await app.init();
  } catch (error) {
    failure = error;
  } finally {
    await app.close();
  }
  if (!(failure instanceof Error))
    throw new Error('the app booted, but the boot check should have refused it');
  return failure;
}
