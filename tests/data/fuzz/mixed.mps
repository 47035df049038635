* a free-format MPS file with every section the reader takes
NAME          MIXED
OBJSENSE
    MAX
ROWS
 N  COST
 L  LIM1
 G  LIM2
 E  MYEQN
 L  RNG
COLUMNS
    MARKER                 'MARKER'                 'INTORG'
    X1        COST         1.0   LIM1         1.0
    X1        LIM2         1.0
    MARKER                 'MARKER'                 'INTEND'
    X2        COST         2.0   LIM1         1.0
    X2        MYEQN       -1.0   RNG          2.5
    X3        COST        -1.0   MYEQN        1.0
    X4        COST         1e+00 LIM2        -3.0
    X5        COST         2.0   LIM1         1.0
    X6        LIM2         1.0
    X7        MYEQN        0.5
RHS
    RHS       COST        -5.0
    RHS       LIM1         4.0   LIM2         1.0
    RHS       MYEQN        7.0   RNG          9.0
RANGES
    RNG       RNG          4.0
BOUNDS
 UP BND       X1           4.0
 MI BND       X2
 LO BND       X3          -1.0
 UP BND       X3           1.0
 FR BND       X4
 BV BND       X5
 LI BND       X6           2
 UI BND       X6           9
 FX BND       X7           3.5
QUADOBJ
    X1        X1           2.0
    X1        X2           0.5
ENDATA
