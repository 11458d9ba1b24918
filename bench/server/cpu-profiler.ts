import { writeFile } from 'node:fs/promises';
import { Session } from 'node:inspector/promises';

let session: Session | undefined;

/**
 * Starts V8's sampling profiler in this process: the same profiler as `node --cpu-prof`, started
 * over the inspector protocol so the profile covers the measured load only, not start-up.
 */
export async function startCpuProfile(intervalUs = 250): Promise<void> {
  session = new Session();
  session.connect();
  await session.post('Profiler.enable');
  await session.post('Profiler.setSamplingInterval', { interval: intervalUs });
  await session.post('Profiler.start');
}

/** Stops the profiler and writes a `.cpuprofile` (open it in Chrome DevTools or speedscope). */
export async function stopCpuProfile(path: string): Promise<void> {
  if (!session) throw new Error('no CPU profile running');
  const { profile } = await session.post('Profiler.stop');
  session.disconnect();
  session = undefined;
  await writeFile(path, JSON.stringify(profile));
}
