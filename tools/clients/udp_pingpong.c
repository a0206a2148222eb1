/* A UDP ping-pong between two processes, both ends polling: the
 * baseline of qperf's rc_lat with -cp 1 (a polling verbs ping-pong). Each
 * side spins on a non-blocking recv(2) and answers at once; the client
 * prints the half round trip, as qperf does, and the CPU both of its
 * threads used (getrusage).
 *
 *   udp_pingpong PORT                  server (answers until killed)
 *   udp_pingpong PORT HOST SIZE SECS   client
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Spin until a datagram of `size` bytes arrives (or `limit` passes). */
static int take(int fd, char *buf, size_t size, struct sockaddr_in *from, double limit)
{
	socklen_t len = sizeof(*from);
	for (;;) {
		ssize_t n = recvfrom(fd, buf, size, MSG_DONTWAIT, (struct sockaddr *)from, &len);
		if (n >= 0)
			return 0;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -1;
		if (now() > limit)
			return -1;
	}
}

int main(int argc, char **argv)
{
	if (argc != 2 && argc != 5) {
		fprintf(stderr, "usage: udp_pingpong PORT [HOST SIZE SECS]\n");
		return 2;
	}
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in me = { .sin_family = AF_INET }, peer;
	char buf[65536];
	if (fd < 0)
		return 1;
	if (argc == 2) {
		me.sin_port = htons(atoi(argv[1]));
		me.sin_addr.s_addr = htonl(INADDR_ANY);
		if (bind(fd, (struct sockaddr *)&me, sizeof(me)))
			return perror("bind"), 1;
		for (;;) {
			socklen_t len = sizeof(peer);
			ssize_t n = recvfrom(fd, buf, sizeof(buf), MSG_DONTWAIT,
					     (struct sockaddr *)&peer, &len);
			if (n >= 0)
				sendto(fd, buf, n, 0, (struct sockaddr *)&peer, len);
		}
	}
	size_t size = atoi(argv[3]);
	double secs = atof(argv[4]);
	if (size < 1 || size > sizeof(buf))
		return 2;
	peer = (struct sockaddr_in){ .sin_family = AF_INET, .sin_port = htons(atoi(argv[1])) };
	inet_pton(AF_INET, argv[2], &peer.sin_addr);
	memset(buf, 0x5a, size);
	/* The server may not be up yet: one answered datagram first. */
	double t0 = now();
	for (;;) {
		sendto(fd, buf, size, 0, (struct sockaddr *)&peer, sizeof(peer));
		struct sockaddr_in from;
		if (take(fd, buf, size, &from, now() + 0.1) == 0)
			break;
		if (now() - t0 > 10)
			return fprintf(stderr, "no answer\n"), 1;
	}
	long rounds = 0;
	t0 = now();
	double end = t0 + secs;
	while (now() < end) {
		struct sockaddr_in from;
		sendto(fd, buf, size, 0, (struct sockaddr *)&peer, sizeof(peer));
		if (take(fd, buf, size, &from, now() + 1))
			return fprintf(stderr, "lost\n"), 1;
		rounds++;
	}
	double took = now() - t0;
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	printf("udp_pingpong: latency = %.2f us, rounds = %ld, secs = %.3f, cpu = %.3f\n",
	       took / rounds / 2 * 1e6, rounds, took,
	       ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
		       ru.ru_stime.tv_usec / 1e6);
	return 0;
}
