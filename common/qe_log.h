/* qe_log: leveled logging to stderr, and QE_ASSERT for bugs (prints file and line, aborts).
 * Thread-safe (one fprintf per line). The level comes from QEVICT_LOG (error|warn|info|debug). */
#ifndef QE_LOG_H
#define QE_LOG_H

enum { QE_LOG_ERROR = 0, QE_LOG_WARN = 1, QE_LOG_INFO = 2, QE_LOG_DEBUG = 3 };

void qe_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int qe_log_level(void);
void qe_log_set_level(int level);
void qe__assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

#define QE_ASSERT(e) ((e) ? (void)0 : qe__assert_fail(#e, __FILE__, __LINE__))

#endif
