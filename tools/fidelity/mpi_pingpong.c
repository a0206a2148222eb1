/* Two MPI ranks: a ping-pong of 8-byte messages and a stream of 1 MiB
 * messages, every byte checked. Prints the half round trip and the stream's
 * bandwidth, then the CPU both ranks used in each (getrusage of each
 * process, threads included: rnic's engine threads count); exits non-zero
 * on any mismatch. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

enum { BIG = 1 << 20 };
/* Round trips and MiB streamed: `mpi_pingpong [ROUNDS [STREAM]]`. */
static int ROUNDS = 2000, STREAM = 200;

static void fill(unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(seed * 31u + i * 7u);
}

static int check(const unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != (unsigned char)(seed * 31u + i * 7u))
			return 0;
	return 1;
}

/* CPU seconds this process has used. */
static double cpu(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
	       ru.ru_stime.tv_usec / 1e6;
}

int main(int argc, char **argv)
{
	int rank, size, bad = 0;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (argc > 1)
		ROUNDS = atoi(argv[1]);
	if (argc > 2)
		STREAM = atoi(argv[2]);
	if (ROUNDS < 1 || STREAM < 1)
		MPI_Abort(MPI_COMM_WORLD, 2);
	if (size != 2) {
		fprintf(stderr, "run with two ranks\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	int peer = 1 - rank;
	unsigned char small[8], *big = malloc(BIG);

	MPI_Barrier(MPI_COMM_WORLD);
	double c0 = cpu();
	double t0 = MPI_Wtime();
	for (unsigned r = 0; r < (unsigned)ROUNDS; r++) {
		if (rank == 0) {
			fill(small, 8, r);
			MPI_Send(small, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
			MPI_Recv(small, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			bad |= !check(small, 8, r + 1);
		} else {
			MPI_Recv(small, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			bad |= !check(small, 8, r);
			fill(small, 8, r + 1);
			MPI_Send(small, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
		}
	}
	double lat = (MPI_Wtime() - t0) / ROUNDS / 2 * 1e6;
	double cpu_lat = cpu() - c0;

	MPI_Barrier(MPI_COMM_WORLD);
	c0 = cpu();
	t0 = MPI_Wtime();
	for (unsigned m = 0; m < (unsigned)STREAM; m++) {
		if (rank == 0) {
			fill(big, BIG, m);
			MPI_Send(big, BIG, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
		} else {
			MPI_Recv(big, BIG, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			bad |= !check(big, BIG, m);
		}
	}
	char done = 0;
	if (rank == 1)
		MPI_Send(&done, 1, MPI_BYTE, peer, 3, MPI_COMM_WORLD);
	else
		MPI_Recv(&done, 1, MPI_BYTE, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
	double bw = (double)BIG * STREAM / (MPI_Wtime() - t0) / 1e6;
	double cpu_bw = cpu() - c0;

	int any = 0;
	MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
	double mine[2] = { cpu_lat, cpu_bw }, both[2];
	MPI_Reduce(mine, both, 2, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
	if (rank == 0) {
		printf("8 B half round trip %.2f us, 1 MiB stream %.0f MB/s, data %s\n", lat, bw,
		       any ? "CORRUPT" : "checked");
		printf("cpu: %.3f s for %d round trips, %.3f s for %d MiB\n", both[0], ROUNDS,
		       both[1], STREAM);
	}
	free(big);
	MPI_Finalize();
	return any ? 1 : 0;
}
