/*
 * A loopback TCP proxy that holds every chunk, in each direction, for a fixed delay before passing
 * it on (bench/support/delay-proxy-process.ts builds and drives it). Written in C rather than on
 * Node because Node's timers have a resolution of one millisecond and a Node proxy spends tens of
 * microseconds of CPU per chunk on the same two cores as the app and PostgreSQL: one thread,
 * epoll, and a timerfd armed for the oldest pending chunk, at nanosecond resolution.
 *
 *   delay-proxy <target-host> <target-port> <delay-ms>
 *
 * Listens on 127.0.0.1 (a free port) and prints `port <n>` on stdout. Then reads commands on
 * stdin, one a line, and answers each on stdout with one line of JSON: `stats` (since the last
 * reset) and `reset`. Exits when stdin closes (the runner went away).
 *
 * One delay for all connections, so due order is arrival order: one FIFO, one timer. End of
 * stream is delayed like data; a reset closes both sides at once. With a delay of 0 a chunk is
 * written as soon as it is read, with no timer: the control that shows what the proxy costs.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define BUFFER_BYTES 65536
#define KEPT_SAMPLES (1 << 18)

/* One side of a proxied connection. Never freed: a bench run opens a few dozen. */
struct endpoint {
  int fd;
  int up;   /* 1: the app's side (its chunks go up to PostgreSQL) */
  int shut; /* its end of stream has been passed on to it */
  struct endpoint *peer;
};

/* A chunk waiting for its time; len 0 is the end of the stream. */
struct chunk {
  uint64_t due_ns;
  uint64_t arrived_ns;
  struct endpoint *to;
  size_t len;
  struct chunk *next;
  char data[];
};

static uint64_t delay_ns;
static struct chunk *head, *tail;
static int epoll_fd, timer_fd, listen_fd;
static struct addrinfo *target;

static struct {
  uint64_t connections, chunks_up, chunks_down, bytes;
} stats;
static double samples[KEPT_SAMPLES];
static uint64_t sample_count;
static struct rusage rusage_since;
static uint64_t since_ns;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void fail(const char *what) {
  perror(what);
  exit(1);
}

static void watch(int fd, void *ptr) {
  struct epoll_event event = {.events = EPOLLIN, .data.ptr = ptr};
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event) < 0) fail("epoll_ctl");
}

static void close_pair(struct endpoint *side) {
  struct endpoint *both[2] = {side, side->peer};
  for (int i = 0; i < 2; i++) {
    if (both[i]->fd < 0) continue;
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, both[i]->fd, NULL);
    close(both[i]->fd);
    both[i]->fd = -1;
  }
}

/* Writes a chunk (or passes on the end of the stream) now. Sockets block on write: the bench's
   messages are small and never fill a socket buffer. */
static void deliver(struct endpoint *to, const char *data, size_t len) {
  if (to->fd < 0) return; /* closed by a reset meanwhile */
  if (len == 0) {
    shutdown(to->fd, SHUT_WR);
    to->shut = 1;
    /* Both ends of stream passed on: everything before them was too (one FIFO). */
    if (to->peer->shut) close_pair(to);
    return;
  }
  size_t done = 0;
  while (done < len) {
    ssize_t written = write(to->fd, data + done, len - done);
    if (written < 0) {
      if (errno == EINTR) continue;
      close_pair(to);
      return;
    }
    done += (size_t)written;
  }
}

static void arm_timer(void) {
  struct itimerspec spec = {0};
  if (head) {
    spec.it_value.tv_sec = (time_t)(head->due_ns / 1000000000u);
    spec.it_value.tv_nsec = (long)(head->due_ns % 1000000000u);
  }
  if (timerfd_settime(timer_fd, TFD_TIMER_ABSTIME, &spec, NULL) < 0) fail("timerfd_settime");
}

static void enqueue(struct endpoint *to, const char *data, size_t len) {
  struct chunk *chunk = malloc(sizeof(struct chunk) + len);
  if (!chunk) fail("malloc");
  chunk->arrived_ns = now_ns();
  chunk->due_ns = chunk->arrived_ns + delay_ns;
  chunk->to = to;
  chunk->len = len;
  chunk->next = NULL;
  memcpy(chunk->data, data, len);
  if (tail) {
    tail->next = chunk;
    tail = chunk;
  } else {
    head = tail = chunk;
    arm_timer(); /* a chunk behind others is never due first: only an empty queue re-arms */
  }
}

static void release_due(void) {
  uint64_t expirations;
  if (read(timer_fd, &expirations, sizeof expirations) < 0 && errno != EAGAIN) fail("read timerfd");
  uint64_t now = now_ns();
  while (head && head->due_ns <= now) {
    struct chunk *chunk = head;
    head = chunk->next;
    if (!head) tail = NULL;
    samples[sample_count++ % KEPT_SAMPLES] = (double)(now - chunk->arrived_ns) / 1e6;
    deliver(chunk->to, chunk->data, chunk->len);
    free(chunk);
  }
  arm_timer();
}

static void pass(struct endpoint *from, const char *data, size_t len) {
  if (len > 0) {
    if (from->up)
      stats.chunks_up++;
    else
      stats.chunks_down++;
    stats.bytes += len;
  }
  if (delay_ns == 0)
    deliver(from->peer, data, len);
  else
    enqueue(from->peer, data, len);
}

static void accept_one(void) {
  int client = accept(listen_fd, NULL, NULL);
  if (client < 0) return;
  int upstream = socket(target->ai_family, SOCK_STREAM, 0);
  if (upstream < 0 || connect(upstream, target->ai_addr, target->ai_addrlen) < 0) {
    close(client);
    if (upstream >= 0) close(upstream);
    return;
  }
  int one = 1;
  setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(upstream, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct endpoint *app = calloc(1, sizeof *app), *database = calloc(1, sizeof *database);
  if (!app || !database) fail("calloc");
  *app = (struct endpoint){.fd = client, .up = 1, .peer = database};
  *database = (struct endpoint){.fd = upstream, .up = 0, .peer = app};
  stats.connections++;
  watch(client, app);
  watch(upstream, database);
}

static void read_side(struct endpoint *side) {
  static char buffer[BUFFER_BYTES];
  ssize_t got = read(side->fd, buffer, sizeof buffer);
  if (got < 0) {
    if (errno == EINTR || errno == EAGAIN) return;
    close_pair(side); /* a reset on one side resets the other */
    return;
  }
  if (got == 0) epoll_ctl(epoll_fd, EPOLL_CTL_DEL, side->fd, NULL); /* nothing more to read */
  pass(side, buffer, (size_t)got);
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void reset(void) {
  memset(&stats, 0, sizeof stats);
  sample_count = 0;
  getrusage(RUSAGE_SELF, &rusage_since);
  since_ns = now_ns();
}

static uint64_t cpu_us(const struct rusage *usage) {
  return (uint64_t)(usage->ru_utime.tv_sec + usage->ru_stime.tv_sec) * 1000000u +
         (uint64_t)(usage->ru_utime.tv_usec + usage->ru_stime.tv_usec);
}

static void print_stats(void) {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  size_t count = sample_count < KEPT_SAMPLES ? sample_count : KEPT_SAMPLES;
  printf("{\"connections\":%llu,\"chunksUp\":%llu,\"chunksDown\":%llu,\"bytes\":%llu,\"cpuUs\":%llu,"
         "\"elapsedMs\":%.3f",
         (unsigned long long)stats.connections, (unsigned long long)stats.chunks_up,
         (unsigned long long)stats.chunks_down, (unsigned long long)stats.bytes,
         (unsigned long long)(cpu_us(&usage) - cpu_us(&rusage_since)), (double)(now_ns() - since_ns) / 1e6);
  if (delay_ns > 0 && count > 0) {
    double *sorted = malloc(count * sizeof(double)), sum = 0;
    if (!sorted) fail("malloc");
    memcpy(sorted, samples, count * sizeof(double));
    qsort(sorted, count, sizeof(double), by_value);
    for (size_t i = 0; i < count; i++) sum += sorted[i];
    size_t p99 = (size_t)((double)count * 0.99 + 0.999999) - 1;
    printf(",\"achievedMs\":{\"count\":%zu,\"mean\":%.4f,\"p50\":%.4f,\"p99\":%.4f,\"max\":%.4f}", count,
           sum / (double)count, sorted[(count + 1) / 2 - 1], sorted[p99 < count ? p99 : count - 1],
           sorted[count - 1]);
    free(sorted);
  } else {
    printf(",\"achievedMs\":null");
  }
  printf("}\n");
  fflush(stdout);
}

static void command(void) {
  static char line[256];
  static size_t used;
  ssize_t got = read(STDIN_FILENO, line + used, sizeof line - 1 - used);
  if (got <= 0) exit(0); /* the runner went away */
  used += (size_t)got;
  char *newline;
  while ((newline = memchr(line, '\n', used))) {
    *newline = '\0';
    if (strcmp(line, "stats") == 0) {
      print_stats();
    } else if (strcmp(line, "reset") == 0) {
      reset();
      printf("{}\n");
      fflush(stdout);
    } else {
      printf("{\"error\":\"unknown command\"}\n");
      fflush(stdout);
    }
    used -= (size_t)(newline + 1 - line);
    memmove(line, newline + 1, used);
  }
  if (used == sizeof line - 1) used = 0; /* a line too long to be a command */
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s <target-host> <target-port> <delay-ms>\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  double delay_ms = atof(argv[3]);
  if (!(delay_ms >= 0)) {
    fprintf(stderr, "delay must be a number of milliseconds >= 0\n");
    return 2;
  }
  delay_ns = (uint64_t)(delay_ms * 1e6 + 0.5);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  if (getaddrinfo(argv[1], argv[2], &hints, &target) != 0) fail("getaddrinfo");

  listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  if (listen_fd < 0) fail("socket");
  struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = 0};
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(listen_fd, (struct sockaddr *)&address, sizeof address) < 0) fail("bind");
  if (listen(listen_fd, 128) < 0) fail("listen");
  socklen_t length = sizeof address;
  getsockname(listen_fd, (struct sockaddr *)&address, &length);

  epoll_fd = epoll_create1(0);
  timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
  if (epoll_fd < 0 || timer_fd < 0) fail("epoll/timerfd");
  static int listen_tag, timer_tag, stdin_tag;
  watch(listen_fd, &listen_tag);
  watch(timer_fd, &timer_tag);
  watch(STDIN_FILENO, &stdin_tag);
  reset();
  printf("port %d\n", ntohs(address.sin_port));
  fflush(stdout);

  struct epoll_event events[64];
  for (;;) {
    int ready = epoll_wait(epoll_fd, events, 64, -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      fail("epoll_wait");
    }
    for (int i = 0; i < ready; i++) {
      void *tag = events[i].data.ptr;
      if (tag == &listen_tag)
        accept_one();
      else if (tag == &timer_tag)
        release_due();
      else if (tag == &stdin_tag)
        command();
      else
        read_side(tag);
    }
  }
}
