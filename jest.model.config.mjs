/**
 * The model-based test (test/model/), on its own: it takes minutes, so `npm test` leaves it out
 * and `npm run test:model` (and `.ci/run`, after `npm test`) runs it. Otherwise jest.config.mjs.
 */
import base from './jest.config.mjs';

export default {
  ...base,
  roots: ['<rootDir>/test/model'],
  testPathIgnorePatterns: ['/node_modules/'],
  // One file, one worker: its child processes and PostgreSQL take the machine's two cores.
  maxWorkers: 1,
};
