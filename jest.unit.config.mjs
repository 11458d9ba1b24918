/**
 * The unit specs (test/unit/), on their own and with no global set-up: no build, no system
 * packages, no PostgreSQL or Redis. `npm run test:unit` runs them while working; `npm test` runs
 * them again with everything else. A spec that needs dist/, a server or an installed program
 * belongs elsewhere (test/packaging/, test/e2e/). Otherwise jest.config.mjs.
 */
import base from './jest.config.mjs';

export default {
  ...base,
  // The base config's set-up imports dist/ and starts PostgreSQL and Redis: these specs need none.
  globalSetup: undefined,
  globalTeardown: undefined,
  roots: ['<rootDir>/test/unit'],
  testPathIgnorePatterns: ['/node_modules/'],
  // Two workers on two cores: these specs compute (no child processes or servers to wait on, as
  // the e2e suite's four workers do), and a third or fourth worker only adds a module graph to load.
  maxWorkers: 2,
};
