import { readdir, readFile } from 'node:fs/promises';
import type pg from 'pg';

/**
 * /proc reports CPU time in clock ticks of USER_HZ, which Linux fixes at 100 per second for every
 * architecture it runs on (the kernel's own HZ may differ; /proc converts).
 */
const US_PER_TICK = 10_000;

/** The fields of /proc/<pid>/stat this reads, in µs. */
interface ProcessTimes {
  parent: number;
  ownUs: number;
  /** CPU of the children it has waited for (a backend that ended, for the postmaster). */
  reapedUs: number;
}

async function processTimes(pid: number): Promise<ProcessTimes | undefined> {
  let stat: string;
  try {
    stat = await readFile(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined; // gone between the listing and the read
  }
  // The command name (2nd field) is in parentheses and may hold spaces: count from its end.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const ticks = (index: number) => Number(fields[index]) * US_PER_TICK;
  return { parent: Number(fields[1]), ownUs: ticks(11) + ticks(12), reapedUs: ticks(13) + ticks(14) };
}

/**
 * The CPU time a PostgreSQL server on this machine has spent: its postmaster, every process it
 * started that is still running (the backends of the bench's pool, the WAL writer, the
 * checkpointer), and those it has reaped. Node's own CPU per event says half of where a delivery's
 * time goes on a machine where Node and PostgreSQL share the cores; this is the other half.
 * Read between two moments, it is what the server did in between, at /proc's 10 ms resolution.
 */
export class DatabaseCpu {
  private constructor(private readonly postmaster: number) {}

  /**
   * For the server `client` is connected to, or undefined when that server is not a process on
   * this machine (a DATABASE_URL elsewhere, another PID namespace).
   */
  static async open(client: pg.Client): Promise<DatabaseCpu | undefined> {
    const { rows } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
    const backend = await processTimes(rows[0]!.pid);
    if (!backend) return undefined;
    const postmaster = await readFile(`/proc/${backend.parent}/comm`, 'utf8').catch(() => '');
    return postmaster.trim() === 'postgres' ? new DatabaseCpu(backend.parent) : undefined;
  }

  /** The server's CPU time so far, in µs (user and system). */
  async read(): Promise<number> {
    const pids = (await readdir('/proc')).filter((name) => /^\d+$/.test(name)).map(Number);
    const times = await Promise.all(pids.map(processTimes));
    let us = 0;
    times.forEach((time, index) => {
      if (!time) return;
      if (pids[index] === this.postmaster) us += time.ownUs + time.reapedUs;
      else if (time.parent === this.postmaster) us += time.ownUs;
    });
    return us;
  }
}
