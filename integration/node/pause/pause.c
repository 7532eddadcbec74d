/* The pod sandbox's process (containerd's sandbox_image): it holds the pod's namespaces and
 * does nothing else. As Kubernetes' own pause (build/pause/linux/pause.c): exit on SIGINT and
 * SIGTERM, reap the zombies a shared PID namespace hands it, otherwise sleep. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction term = {.sa_handler = stop}, child = {.sa_handler = reap,
                                                         .sa_flags = SA_NOCLDSTOP};
    if (getpid() != 1) {
        return 1; /* only as a container's first process */
    }
    if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0 ||
        sigaction(SIGCHLD, &child, NULL) < 0) {
        return 2;
    }
    for (;;) {
        pause();
    }
}
