/*
 * slowfs: a parallel file system (PFS) on one machine.
 *
 * A read-only FUSE mirror of SOURCE that behaves like a loaded Lustre seen by
 * one client: every metadata operation costs a fixed latency, every read
 * request a fixed latency, all reads share one aggregate bandwidth, and at
 * most max-inflight requests are served at once.
 *
 *   slowfs SOURCE MOUNTPOINT [--meta-latency-ms 1.0] [--read-latency-ms 0.5]
 *          [--bandwidth-mbps 400] [--max-inflight 16] [--stats FILE]
 *          [--threads N] [-d]
 *
 * Runs in the foreground until unmounted or SIGTERM/SIGINT, then unmounts
 * itself and writes the final stats.  SIGUSR1 writes a stats snapshot now.
 *
 * Cost model (all sleeps are clock_nanosleep on CLOCK_MONOTONIC, so requests
 * in different threads overlap):
 *   - metadata op (lookup, getattr, open, opendir, readdir, readlink, access,
 *     statfs): hold an in-flight slot for meta-latency.
 *   - read of n bytes arriving at t: hold a slot, transfer starts at
 *     max(t + read-latency, end of the previous transfer) and lasts
 *     n / bandwidth ("next free time" under a mutex); the reply is sent when
 *     the transfer ends.  One client streaming sees latency + n/bandwidth per
 *     request; many clients together see the aggregate bandwidth.
 *   - in-flight slots: a counting semaphore of max-inflight; requests beyond
 *     wait.  The session loop has --threads workers (default max-inflight +
 *     8) and the kernel's max_background is raised to match, so it is the
 *     semaphore, not libfuse or the kernel, that bounds concurrency.
 *   MB means 10^6 bytes; --bandwidth-mbps 0 means unlimited.
 *
 * Kernel caches: entry, attribute and negative timeouts are 0, so every path
 * walk and stat reaches slowfs (one LOOKUP per component, then GETATTR).
 * Page cache: we do NOT use direct_io.  Without FOPEN_KEEP_CACHE the FUSE
 * kernel module invalidates a file's page cache at every open
 * (invalidate_inode_pages2 in fuse_open), so each open reads the bytes again
 * through slowfs (tests/test_slowfs.py proves it: N opens of a file send
 * N x size bytes), while mmap, which direct_io would break, keeps working.
 * Within one open the page cache and the kernel's readahead (128 KiB
 * requests) work as on a real client.  auto_inval_data is turned off: with
 * it the kernel sends a GETATTR before every read() syscall (cat of 100 MiB
 * took 1.07 s instead of 0.34 s), which no PFS client does.
 *
 * Write-type operations: mounted "ro", so the kernel answers EROFS itself;
 * the handlers below answer EROFS too, should one ever get through.
 *
 * Nodes are identified by the source's (st_dev, st_ino) and remember their
 * path relative to SOURCE; no file descriptor is held per node, so a data set
 * of millions of files does not run out of descriptors.
 */
#define _GNU_SOURCE
#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <search.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define USAGE \
	"usage: slowfs SOURCE MOUNTPOINT [--meta-latency-ms 1.0] [--read-latency-ms 0.5]\n" \
	"              [--bandwidth-mbps 400] [--max-inflight 16] [--stats FILE]\n" \
	"              [--threads N] [-d]\n" \
	"Mirror SOURCE read-only at MOUNTPOINT with PFS-like latency and bandwidth.\n"

static struct {
	const char *source, *mountpoint, *stats_file;
	double meta_ms, read_ms, mbps;
	int max_inflight, threads, debug;
	int src_fd;
	int64_t meta_ns, read_ns;
} cfg = { .meta_ms = 1.0, .read_ms = 0.5, .mbps = 400.0, .max_inflight = 16 };

/* ---- counters --------------------------------------------------------- */

enum { C_META, C_LOOKUP, C_GETATTR, C_OPEN, C_RELEASE, C_READ, C_BYTES,
       C_READDIR, C_ERROR, C_N, C_NONE = -1 };
static const char *const counter_names[C_N] = {
	"meta_ops", "lookups", "getattrs", "opens", "releases", "reads",
	"bytes", "readdirs", "errors" };
static _Atomic uint64_t counters[C_N];

static void count(int c, uint64_t n)
{
	atomic_fetch_add_explicit(&counters[c], n, memory_order_relaxed);
}

static void reply_err(fuse_req_t req, int err)
{
	if (err)
		count(C_ERROR, 1);
	fuse_reply_err(req, err);
}

/* ---- time, in-flight slots, bandwidth -------------------------------- */

static sem_t inflight;
static pthread_mutex_t bw_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t bw_next_free;	/* ns, CLOCK_MONOTONIC: end of the last transfer */

static int64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void sleep_until(int64_t ns)
{
	struct timespec t = { .tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000 };
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR)
		;
}

static void slot_get(void)
{
	while (sem_wait(&inflight) != 0 && errno == EINTR)
		;
}

static void slot_put(void)
{
	sem_post(&inflight);
}

/* A metadata operation: count it, then hold a slot for the latency. */
static void meta(int c)
{
	count(C_META, 1);
	if (c != C_NONE)
		count(c, 1);
	slot_get();
	sleep_until(now_ns() + cfg.meta_ns);
	slot_put();
}

/* ---- nodes ------------------------------------------------------------ */

struct node {
	dev_t dev;
	ino_t ino;
	uint64_t nlookup;
	char *path;	/* relative to SOURCE, "." for the root; never changes */
};

static struct node root = { .path = "." };
static void *nodes;	/* tsearch tree of struct node, keyed by (dev, ino) */
static pthread_mutex_t nodes_lock = PTHREAD_MUTEX_INITIALIZER;

static int node_cmp(const void *a, const void *b)
{
	const struct node *x = a, *y = b;
	if (x->dev != y->dev)
		return x->dev < y->dev ? -1 : 1;
	if (x->ino != y->ino)
		return x->ino < y->ino ? -1 : 1;
	return 0;
}

static struct node *node_of(fuse_ino_t ino)
{
	return ino == FUSE_ROOT_ID ? &root : (struct node *)(uintptr_t)ino;
}

static fuse_ino_t node_id(struct node *n)
{
	return n == &root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)n;
}

/* The node of st (found or created, path copied), with one more lookup. */
static struct node *node_ref(const struct stat *st, const char *path)
{
	struct node key = { .dev = st->st_dev, .ino = st->st_ino }, *n;
	void **slot;

	if (node_cmp(&key, &root) == 0)
		return &root;
	pthread_mutex_lock(&nodes_lock);
	slot = tfind(&key, &nodes, node_cmp);
	if (slot) {
		n = *slot;
		n->nlookup++;
	} else if ((n = calloc(1, sizeof *n)) != NULL) {
		*n = key;
		n->nlookup = 1;
		n->path = strdup(path);
		if (!n->path || !tsearch(n, &nodes, node_cmp)) {
			free(n->path);
			free(n);
			n = NULL;
		}
	}
	pthread_mutex_unlock(&nodes_lock);
	return n;
}

static void node_unref(fuse_ino_t ino, uint64_t nlookup)
{
	struct node *n = node_of(ino);

	if (n == &root)
		return;
	pthread_mutex_lock(&nodes_lock);
	n->nlookup -= nlookup < n->nlookup ? nlookup : n->nlookup;
	if (n->nlookup == 0) {
		tdelete(n, &nodes, node_cmp);
		free(n->path);
		free(n);
	}
	pthread_mutex_unlock(&nodes_lock);
}

static char *child_path(fuse_ino_t parent, const char *name)
{
	const char *dir = node_of(parent)->path;
	char *p;

	if (strcmp(dir, ".") == 0)
		return strdup(name);
	return asprintf(&p, "%s/%s", dir, name) < 0 ? NULL : p;
}

/* ---- operations ------------------------------------------------------- */

static void sf_init(void *userdata, struct fuse_conn_info *conn)
{
	(void)userdata;
	/* async (readahead) reads are bounded by max_background: let the
	 * in-flight semaphore, not the kernel's default of 12, decide */
	conn->max_background = cfg.threads;
	conn->congestion_threshold = cfg.threads * 3 / 4 + 1;
	/* no GETATTR before every read() (see the top comment) */
	conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
}

static void sf_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e;
	struct node *n;
	char *path = child_path(parent, name);

	meta(C_LOOKUP);
	memset(&e, 0, sizeof e);
	if (!path) {
		reply_err(req, ENOMEM);
		return;
	}
	if (fstatat(cfg.src_fd, path, &e.attr, AT_SYMLINK_NOFOLLOW) != 0) {
		reply_err(req, errno);
	} else if (!(n = node_ref(&e.attr, path))) {
		reply_err(req, ENOMEM);
	} else {
		e.ino = node_id(n);
		e.attr_timeout = 0.0;
		e.entry_timeout = 0.0;
		fuse_reply_entry(req, &e);
	}
	free(path);
}

static void sf_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	node_unref(ino, nlookup);
	fuse_reply_none(req);
}

static void sf_forget_multi(fuse_req_t req, size_t count_, struct fuse_forget_data *f)
{
	for (size_t i = 0; i < count_; i++)
		node_unref(f[i].ino, f[i].nlookup);
	fuse_reply_none(req);
}

static void sf_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stat st;

	(void)fi;
	meta(C_GETATTR);
	if (fstatat(cfg.src_fd, node_of(ino)->path, &st, AT_SYMLINK_NOFOLLOW) != 0)
		reply_err(req, errno);
	else
		fuse_reply_attr(req, &st, 0.0);
}

static void sf_readlink(fuse_req_t req, fuse_ino_t ino)
{
	char buf[PATH_MAX + 1];
	ssize_t n;

	meta(C_NONE);
	n = readlinkat(cfg.src_fd, node_of(ino)->path, buf, sizeof buf - 1);
	if (n < 0) {
		reply_err(req, errno);
		return;
	}
	buf[n] = '\0';
	fuse_reply_readlink(req, buf);
}

static void sf_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
	meta(C_NONE);
	if (mask & W_OK)
		reply_err(req, EROFS);
	else
		reply_err(req, faccessat(cfg.src_fd, node_of(ino)->path, mask, 0) ? errno : 0);
}

static void sf_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs sv;

	(void)ino;
	meta(C_NONE);
	if (fstatvfs(cfg.src_fd, &sv) != 0)
		reply_err(req, errno);
	else
		fuse_reply_statfs(req, &sv);
}

struct dir {
	DIR *dp;
	struct dirent *entry;	/* read but not yet returned */
	off_t offset;
};

static void sf_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct dir *d;
	int fd, err;

	meta(C_NONE);
	fd = openat(cfg.src_fd, node_of(ino)->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		reply_err(req, errno);
		return;
	}
	d = calloc(1, sizeof *d);
	if (!d || !(d->dp = fdopendir(fd))) {
		err = d ? errno : ENOMEM;
		close(fd);
		free(d);
		reply_err(req, err);
		return;
	}
	fi->fh = (uintptr_t)d;
	if (fuse_reply_open(req, fi) == -ENOENT) {	/* interrupted */
		closedir(d->dp);
		free(d);
	}
}

static void sf_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	struct dir *d = (struct dir *)(uintptr_t)fi->fh;
	char *buf = malloc(size), *p = buf;
	size_t rem = size, len;
	int err = 0;

	(void)ino;
	meta(C_READDIR);
	if (!buf) {
		reply_err(req, ENOMEM);
		return;
	}
	if (off != d->offset) {
		seekdir(d->dp, off);
		d->entry = NULL;
		d->offset = off;
	}
	for (;;) {
		struct stat st;

		if (!d->entry) {
			errno = 0;
			d->entry = readdir(d->dp);
			if (!d->entry) {
				err = errno;
				break;
			}
		}
		memset(&st, 0, sizeof st);
		st.st_ino = d->entry->d_ino;
		st.st_mode = (mode_t)d->entry->d_type << 12;
		len = fuse_add_direntry(req, p, rem, d->entry->d_name, &st, d->entry->d_off);
		if (len > rem)
			break;
		p += len;
		rem -= len;
		d->offset = d->entry->d_off;
		d->entry = NULL;
	}
	if (err && rem == size)
		reply_err(req, err);
	else
		fuse_reply_buf(req, buf, size - rem);
	free(buf);
}

static void sf_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct dir *d = (struct dir *)(uintptr_t)fi->fh;

	(void)ino;
	closedir(d->dp);
	free(d);
	fuse_reply_err(req, 0);
}

static void sf_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	int fd;

	meta(C_OPEN);
	if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
		reply_err(req, EROFS);
		return;
	}
	fd = openat(cfg.src_fd, node_of(ino)->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		reply_err(req, errno);
		return;
	}
	fi->fh = (uint64_t)fd;
	fi->keep_cache = 0;	/* the kernel drops the page cache at each open */
	fi->direct_io = 0;	/* not needed (see the top comment); keeps mmap */
	if (fuse_reply_open(req, fi) == -ENOENT)	/* interrupted */
		close(fd);
}

static void sf_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	char *buf = malloc(size ? size : 1);
	int64_t start, done;
	ssize_t n = -1;
	int err = ENOMEM;

	(void)ino;
	count(C_READ, 1);
	slot_get();
	start = now_ns();
	if (buf) {
		n = pread((int)fi->fh, buf, size, off);
		err = errno;
	}
	done = start + cfg.read_ns;
	if (n > 0) {
		count(C_BYTES, (uint64_t)n);
		if (cfg.mbps > 0) {
			pthread_mutex_lock(&bw_lock);
			if (done < bw_next_free)
				done = bw_next_free;
			done += (int64_t)((double)n * 1000.0 / cfg.mbps);
			bw_next_free = done;
			pthread_mutex_unlock(&bw_lock);
		}
	}
	sleep_until(done);
	slot_put();
	if (n < 0)
		reply_err(req, err);
	else
		fuse_reply_buf(req, buf, (size_t)n);
	free(buf);
}

static void sf_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	count(C_RELEASE, 1);
	close((int)fi->fh);
	fuse_reply_err(req, 0);
}

/* Write-type operations (unreachable while mounted "ro"). */
static void sf_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		       struct fuse_file_info *fi)
{
	(void)ino; (void)attr; (void)to_set; (void)fi;
	reply_err(req, EROFS);
}

static void sf_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	(void)parent; (void)name; (void)mode; (void)rdev;
	reply_err(req, EROFS);
}

static void sf_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	(void)parent; (void)name; (void)mode;
	reply_err(req, EROFS);
}

static void sf_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	(void)parent; (void)name;
	reply_err(req, EROFS);
}

static void sf_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	(void)link; (void)parent; (void)name;
	reply_err(req, EROFS);
}

static void sf_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
		      fuse_ino_t newparent, const char *newname, unsigned int flags)
{
	(void)parent; (void)name; (void)newparent; (void)newname; (void)flags;
	reply_err(req, EROFS);
}

static void sf_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	(void)ino; (void)newparent; (void)newname;
	reply_err(req, EROFS);
}

static void sf_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size,
		     off_t off, struct fuse_file_info *fi)
{
	(void)ino; (void)buf; (void)size; (void)off; (void)fi;
	reply_err(req, EROFS);
}

static void sf_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      struct fuse_file_info *fi)
{
	(void)parent; (void)name; (void)mode; (void)fi;
	reply_err(req, EROFS);
}

static void sf_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
			size_t size, int flags)
{
	(void)ino; (void)name; (void)value; (void)size; (void)flags;
	reply_err(req, EROFS);
}

static void sf_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	(void)ino; (void)name;
	reply_err(req, EROFS);
}

static void sf_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
			 struct fuse_file_info *fi)
{
	(void)ino; (void)mode; (void)offset; (void)length; (void)fi;
	reply_err(req, EROFS);
}

static const struct fuse_lowlevel_ops ops = {
	.init = sf_init,
	.lookup = sf_lookup,
	.forget = sf_forget,
	.forget_multi = sf_forget_multi,
	.getattr = sf_getattr,
	.readlink = sf_readlink,
	.access = sf_access,
	.statfs = sf_statfs,
	.opendir = sf_opendir,
	.readdir = sf_readdir,
	.releasedir = sf_releasedir,
	.open = sf_open,
	.read = sf_read,
	.release = sf_release,
	.setattr = sf_setattr,
	.mknod = sf_mknod,
	.mkdir = sf_mkdir,
	.unlink = sf_unlink,
	.rmdir = sf_unlink,
	.symlink = sf_symlink,
	.rename = sf_rename,
	.link = sf_link,
	.write = sf_write,
	.create = sf_create,
	.setxattr = sf_setxattr,
	.removexattr = sf_removexattr,
	.fallocate = sf_fallocate,
};

/* ---- stats ------------------------------------------------------------ */

static sem_t stats_wake;
static atomic_int stats_stop;
static unsigned long long stats_seq;

static void on_usr1(int sig)
{
	(void)sig;
	sem_post(&stats_wake);	/* async-signal-safe */
}

/* {"pid":..., "seq":..., counters...} to FILE.tmp.PID, renamed over FILE. */
static void write_stats(void)
{
	char buf[1024], tmp[PATH_MAX];
	int len, fd, ok;

	if (!cfg.stats_file)
		return;
	len = snprintf(buf, sizeof buf, "{\"pid\": %d, \"seq\": %llu", (int)getpid(), ++stats_seq);
	for (int i = 0; i < C_N; i++)
		len += snprintf(buf + len, sizeof buf - (size_t)len, ", \"%s\": %llu", counter_names[i],
				(unsigned long long)atomic_load(&counters[i]));
	len += snprintf(buf + len, sizeof buf - (size_t)len, "}\n");
	snprintf(tmp, sizeof tmp, "%s.tmp.%d", cfg.stats_file, (int)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	ok = fd >= 0 && write(fd, buf, (size_t)len) == len;
	if (fd >= 0 && close(fd) != 0)
		ok = 0;
	if (!ok || rename(tmp, cfg.stats_file) != 0) {
		fprintf(stderr, "slowfs: cannot write %s: %s\n", cfg.stats_file, strerror(errno));
		unlink(tmp);
	}
}

/* Writes now, then every 200 ms or when SIGUSR1 arrives, and once more when
 * told to stop. */
static void *stats_main(void *arg)
{
	(void)arg;
	for (;;) {
		struct timespec t;

		write_stats();
		if (atomic_load(&stats_stop))
			return NULL;
		clock_gettime(CLOCK_MONOTONIC, &t);
		t.tv_nsec += 200000000;
		if (t.tv_nsec >= 1000000000) {
			t.tv_sec++;
			t.tv_nsec -= 1000000000;
		}
		while (sem_clockwait(&stats_wake, CLOCK_MONOTONIC, &t) != 0 && errno == EINTR)
			;
	}
}

/* ---- main ------------------------------------------------------------- */

static void usage(void)
{
	fputs(USAGE, stderr);
	exit(2);
}

static double number(const char *opt, const char *s, double min)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= min)) {
		fprintf(stderr, "slowfs: %s: bad value '%s' (a number >= %g)\n", opt, s, min);
		usage();
	}
	return v;
}

static void parse_args(int argc, char **argv)
{
	enum { O_META = 256, O_READ, O_BW, O_INFLIGHT, O_STATS, O_THREADS };
	static const struct option longopts[] = {
		{ "meta-latency-ms", required_argument, NULL, O_META },
		{ "read-latency-ms", required_argument, NULL, O_READ },
		{ "bandwidth-mbps", required_argument, NULL, O_BW },
		{ "max-inflight", required_argument, NULL, O_INFLIGHT },
		{ "stats", required_argument, NULL, O_STATS },
		{ "threads", required_argument, NULL, O_THREADS },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	while ((c = getopt_long(argc, argv, "dh", longopts, NULL)) != -1) {
		switch (c) {
		case O_META: cfg.meta_ms = number("--meta-latency-ms", optarg, 0); break;
		case O_READ: cfg.read_ms = number("--read-latency-ms", optarg, 0); break;
		case O_BW: cfg.mbps = number("--bandwidth-mbps", optarg, 0); break;
		case O_INFLIGHT: cfg.max_inflight = (int)number("--max-inflight", optarg, 1); break;
		case O_STATS: cfg.stats_file = optarg; break;
		case O_THREADS: cfg.threads = (int)number("--threads", optarg, 1); break;
		case 'd': cfg.debug = 1; break;
		case 'h': fputs(USAGE, stdout); exit(0);
		default: usage();
		}
	}
	if (argc - optind != 2)
		usage();
	cfg.source = argv[optind];
	cfg.mountpoint = argv[optind + 1];
	if (cfg.max_inflight > 100000 || cfg.threads > 100000)
		usage();
	if (cfg.threads == 0)
		cfg.threads = cfg.max_inflight + 8;
	cfg.meta_ns = (int64_t)(cfg.meta_ms * 1e6);
	cfg.read_ns = (int64_t)(cfg.read_ms * 1e6);
}

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct fuse_session *se;
	struct sigaction sa;
	struct rlimit rl;
	struct stat st;
	pthread_t stats_thread;
	int ret = 1;

	parse_args(argc, argv);
	cfg.src_fd = open(cfg.source, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (cfg.src_fd < 0 || fstat(cfg.src_fd, &st) != 0) {
		fprintf(stderr, "slowfs: SOURCE %s: %s\n", cfg.source, strerror(errno));
		return 2;
	}
	root.dev = st.st_dev;
	root.ino = st.st_ino;
	/* one descriptor per file open by clients */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	sem_init(&inflight, 0, (unsigned)cfg.max_inflight);
	sem_init(&stats_wake, 0, 0);
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_usr1;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);

	if (fuse_opt_add_arg(&args, argv[0]) != 0 ||
	    fuse_opt_add_arg(&args, "-o") != 0 ||
	    fuse_opt_add_arg(&args, "ro,subtype=slowfs") != 0 ||
	    (cfg.debug && fuse_opt_add_arg(&args, "-d") != 0))
		return 1;
	se = fuse_session_new(&args, &ops, sizeof ops, NULL);
	if (!se)
		goto out_args;
	if (fuse_set_signal_handlers(se) != 0)
		goto out_session;
	if (fuse_session_mount(se, cfg.mountpoint) != 0)
		goto out_signals;
	if (pthread_create(&stats_thread, NULL, stats_main, NULL) != 0)
		goto out_unmount;
	{
#if FUSE_USE_VERSION >= 312
		struct fuse_loop_config *lc = fuse_loop_cfg_create();
		fuse_loop_cfg_set_max_threads(lc, (unsigned)cfg.threads);
		fuse_loop_cfg_set_idle_threads(lc, (unsigned)cfg.threads);
		ret = fuse_session_loop_mt(se, lc) < 0;	/* > 0: signal */
		fuse_loop_cfg_destroy(lc);
#else	/* libfuse < 3.12 starts threads on demand without a maximum */
		struct fuse_loop_config lc = { .clone_fd = 0, .max_idle_threads = (unsigned)cfg.threads };
		ret = fuse_session_loop_mt(se, &lc) < 0;
#endif
	}
	fuse_session_unmount(se);
	atomic_store(&stats_stop, 1);
	sem_post(&stats_wake);
	pthread_join(stats_thread, NULL);	/* writes the final stats */
	goto out_signals;
out_unmount:
	fuse_session_unmount(se);
out_signals:
	fuse_remove_signal_handlers(se);
out_session:
	fuse_session_destroy(se);
out_args:
	fuse_opt_free_args(&args);
	return ret;
}
