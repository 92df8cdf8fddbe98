/* qe_env: the environment's tuning knobs, all read the one way. A knob that is unset or empty
 * takes its default; a value it does not take is ignored with a warning that names the knob,
 * the value, what is expected and the default used (qe_log), and the run goes on. */
#ifndef QE_ENV_H
#define QE_ENV_H

/* The index of $name's value among vals[0..n) (exact match), else dflt. */
int qe_env_choice(const char *name, const char *const *vals, int n, int dflt);

/* $name as a decimal integer in lo..hi, else dflt. */
long qe_env_long(const char *name, long lo, long hi, long dflt);

#endif
