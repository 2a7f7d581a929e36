// The cost of serving random 4 KiB records from the page cache into a loopback TCP socket, by
// three ways of getting the bytes from the page cache to the socket, with nothing else of
// packrat in the way (no HTTP, no index, no async runtime). It answers one design question:
// how much of a batch GET sample's CPU a zero-copy send could save on this machine.
//
//   pread      what packrat does: one preadv per record into its place in a 1 MiB frame
//              (record header to a side buffer), every payload byte read once to verify it,
//              the frame written to the socket;
//   mmap-copy  the file mapped; each payload copied from the mapping into the frame, then
//              verified there (no system call and no page-cache lookup per record);
//   mmap-send  the file mapped; each payload verified in the mapping and sent from it with
//              writev (one copy fewer, but what goes out is read again after it was verified);
//   mincore-copy  as mmap-copy, after asking mincore whether the record's pages are resident
//              (the check a reader would need to never wait for the disk on a mapping);
//   uring-batch  as pread, but a frame's reads (up to 512) are queued as io_uring READV with
//              RWF_NOWAIT and submitted with one io_uring_enter (one syscall per frame).
//
// Each record gets 1536 bytes of TAR-like headers in the frame, as batch GET sends. A second
// thread reads the socket into a 256 KiB buffer and counts bytes, as a client would. "Verify"
// is a vectorised sum of every byte (a stand-in for crc32c that reads at memory speed).
//
//   bench/copy_paths.sh        # builds this with cc (needs liburing-dev) and runs every mode
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <liburing.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

enum { HDR = 64, PAYLOAD = 4096, TAR_HDR = 1536, FRAME = 1 << 20, BATCH_IOV = 64 };

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static double thread_cpu_s(void) {
  struct rusage r;
  getrusage(RUSAGE_THREAD, &r);
  return r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec +
         r.ru_stime.tv_usec / 1e6;
}

static uint64_t verify(const uint8_t *p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t v;
    memcpy(&v, p + i, 8);
    s += v;
  }
  return s;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

static void write_all(int fd, const uint8_t *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) die("write");
    p += w;
    n -= (size_t)w;
  }
}

static void writev_all(int fd, struct iovec *iov, int cnt) {
  while (cnt > 0) {
    ssize_t w = writev(fd, iov, cnt);
    if (w < 0) die("writev");
    while (cnt > 0 && (size_t)w >= iov->iov_len) {
      w -= (ssize_t)iov->iov_len;
      iov++;
      cnt--;
    }
    if (cnt > 0) {
      iov->iov_base = (uint8_t *)iov->iov_base + w;
      iov->iov_len -= (size_t)w;
    }
  }
}

struct reader {
  int fd;
  uint64_t bytes;
  double cpu_s;
};

static void *read_loop(void *arg) {
  struct reader *r = arg;
  uint8_t *buf = malloc(256 * 1024);
  double c0 = thread_cpu_s();
  for (;;) {
    ssize_t n = read(r->fd, buf, 256 * 1024);
    if (n <= 0) break;
    r->bytes += (uint64_t)n;
  }
  r->cpu_s = thread_cpu_s() - c0;
  free(buf);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s FILE pread|mmap-copy|mmap-send|mincore-copy|uring-batch RECORDS\n",
            argv[0]);
    return 2;
  }
  const char *mode = argv[2];
  long records = atol(argv[3]);
  int fd = open(argv[1], O_RDONLY);
  if (fd < 0) die("open");
  off_t file_bytes = lseek(fd, 0, SEEK_END);
  long slots = file_bytes / (HDR + PAYLOAD);
  const uint8_t *map = mmap(NULL, (size_t)file_bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) die("mmap");

  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) ||
      getsockname(ls, (struct sockaddr *)&a, &al))
    die("listen");
  int cs = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(cs, (struct sockaddr *)&a, sizeof a)) die("connect");
  int ss = accept(ls, NULL, NULL);
  int one = 1;
  setsockopt(ss, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct reader rd = {.fd = cs};
  pthread_t th;
  pthread_create(&th, NULL, read_loop, &rd);

  uint8_t *frame = malloc(FRAME + TAR_HDR + HDR + PAYLOAD);
  uint8_t tar_hdr[TAR_HDR];
  memset(tar_hdr, 'h', sizeof tar_hdr);
  uint8_t side[HDR];
  struct iovec iov[2 * BATCH_IOV];
  uint64_t seed = 88172645463325252ull, sum = 0;
  enum { RING = 512 };
  struct io_uring ring;
  if (io_uring_queue_init(RING, &ring, 0)) die("io_uring_queue_init");
  static uint8_t sides[RING][HDR];
  static struct iovec uiov[2 * RING];
  unsigned queued = 0;
  static off_t uoff[FRAME / PAYLOAD + 1];
  long again = 0;
  size_t used = 0;
  int n_iov = 0;
  double t0 = now_s(), c0 = thread_cpu_s();
  for (long i = 0; i < records; i++) {
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    off_t at = (off_t)(seed % (uint64_t)slots) * (HDR + PAYLOAD);
    if (strcmp(mode, "mmap-send") == 0) {
      sum += verify(map + at + HDR, PAYLOAD);
      memcpy(frame + (size_t)n_iov * TAR_HDR / 2, tar_hdr, TAR_HDR);
      iov[n_iov].iov_base = frame + (size_t)n_iov * TAR_HDR / 2;
      iov[n_iov].iov_len = TAR_HDR;
      iov[n_iov + 1].iov_base = (void *)(map + at + HDR);
      iov[n_iov + 1].iov_len = PAYLOAD;
      n_iov += 2;
      if (n_iov == 2 * BATCH_IOV) {
        writev_all(ss, iov, n_iov);
        n_iov = 0;
      }
      continue;
    }
    memcpy(frame + used, tar_hdr, TAR_HDR);
    used += TAR_HDR;
    if (strcmp(mode, "uring-batch") == 0) {
      struct iovec *r = &uiov[2 * queued];
      r[0] = (struct iovec){sides[queued], HDR};
      r[1] = (struct iovec){frame + used, PAYLOAD};
      struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
      io_uring_prep_readv(sqe, fd, r, 2, at);
      sqe->rw_flags = RWF_NOWAIT;
      sqe->user_data = (uint64_t)(used);
      uoff[(used % FRAME) / PAYLOAD] = at;
      queued++;
      used += PAYLOAD;
      if (used >= FRAME || queued == RING || i + 1 == records) {
        if (io_uring_submit_and_wait(&ring, queued) < 0) die("submit");
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
          if (cqe->res == -EAGAIN || (cqe->res >= 0 && cqe->res < HDR + PAYLOAD)) {
            // Not (all) readable without waiting (a page being read ahead): read it the usual
            // way.
            size_t slot = (size_t)cqe->user_data;
            struct iovec r[2] = {{sides[0], HDR}, {frame + slot, PAYLOAD}};
            off_t back = uoff[(slot % FRAME) / PAYLOAD];
            if (preadv(fd, r, 2, back) != HDR + PAYLOAD) die("preadv");
            again++;
          } else if (cqe->res != HDR + PAYLOAD) {
            fprintf(stderr, "res %d\n", cqe->res);
            exit(1);
          }
          sum += verify(frame + cqe->user_data, PAYLOAD);
          seen++;
        }
        io_uring_cq_advance(&ring, seen);
        if (seen != queued) die("short reap");
        queued = 0;
        if (used >= FRAME) {
          write_all(ss, frame, used);
          used = 0;
        }
      }
      continue;
    }
    if (strcmp(mode, "pread") == 0) {
      struct iovec r[2] = {{side, HDR}, {frame + used, PAYLOAD}};
      if (preadv2(fd, r, 2, at, RWF_NOWAIT) != HDR + PAYLOAD) {
        // Not (all) readable without waiting: read it the usual way.
        if (preadv(fd, r, 2, at) != HDR + PAYLOAD) die("preadv");
        again++;
      }
    } else if (strcmp(mode, "mincore-copy") == 0) {
      uintptr_t first = ((uintptr_t)(map + at)) & ~(uintptr_t)4095;
      uintptr_t last = ((uintptr_t)(map + at + HDR + PAYLOAD) + 4095) & ~(uintptr_t)4095;
      unsigned char vec[4];
      if (mincore((void *)first, last - first, vec)) die("mincore");
      for (size_t p = 0; p < (last - first) / 4096; p++)
        if (!(vec[p] & 1)) die("not resident");
      memcpy(frame + used, map + at + HDR, PAYLOAD);
    } else {
      memcpy(frame + used, map + at + HDR, PAYLOAD);
    }
    sum += verify(frame + used, PAYLOAD);
    used += PAYLOAD;
    if (used >= FRAME) {
      write_all(ss, frame, used);
      used = 0;
    }
  }
  if (n_iov > 0) writev_all(ss, iov, n_iov);
  if (used > 0) write_all(ss, frame, used);
  double cpu = thread_cpu_s() - c0;
  shutdown(ss, SHUT_WR);
  pthread_join(th, NULL);
  double wall = now_s() - t0;
  printf("%-12s %9.0f records/s  sender %.2f µs/record  reader %.2f µs/record  (%.1f MB/s of "
         "payload; check %llu)",
         mode, records / wall, cpu * 1e6 / records, rd.cpu_s * 1e6 / records,
         records * (double)PAYLOAD / wall / 1e6, (unsigned long long)(sum & 0xff));
  if (again > 0) printf("  [%ld reads refused without waiting, re-read]", again);
  printf("\n");
  return 0;
}
